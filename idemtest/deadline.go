package idemtest

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

func deadlineCases[TTx any]() []testCase[TTx] {
	return []testCase[TTx]{
		{"ClaimLockTimeout", testClaimLockTimeout[TTx]},
	}
}

// A delivery whose record another transaction holds (a copy still in its
// handler, or a session that stalled with the record locked) waits at most
// the claim's lock timeout (StoreTimeout/2), then gets InProgress with an
// error matching ErrLockTimeout: redelivered later, never acked, with
// nothing recorded. A batch sharing the ID does the same. Once the holder
// commits, the redelivery is a Duplicate and the effect exists once.
//
// A store whose claims never wait on a record (SQLite takes its write lock
// at BEGIN, so the second delivery waits for the first in Begin, up to its
// busy timeout) may instead fail the delivery with ErrStore; it must not
// ack it either.
func testClaimLockTimeout[TTx any](t *testing.T, b *bundle[TTx]) {
	const storeTimeout = 2 * time.Second
	c := b.consumer("c", idem.Config{StoreTimeout: storeTimeout})
	var calls atomic.Int64
	ok := b.handler(c, &calls)
	inHandler, release := make(chan struct{}), make(chan struct{})
	holding := func(ctx context.Context, tx TTx, msg idem.Message) error {
		close(inHandler)
		<-release
		return ok(ctx, tx, msg)
	}
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}
	type result struct {
		out idem.Outcome
		err error
	}
	first := make(chan result, 1)
	go func() { o, e := c.Process(b.ctx, msg, holding); first <- result{o, e} }()
	if !waitFor(t, inHandler, "first delivery reaching its handler") {
		close(release)
		return
	}
	start := time.Now()
	out, err := c.Process(b.ctx, msg, ok)
	took := time.Since(start)
	waits := out.Status == idem.InProgress
	if waits {
		b.wantOutcome("copy behind the held record", msg.ID, out, err, idem.InProgress, idem.ErrLockTimeout)
		if !errors.Is(err, idem.ErrInProgress) || out.RetryAfter <= 0 {
			t.Errorf("copy behind the held record: err %v, RetryAfter %v: want ErrInProgress and a positive delay", err, out.RetryAfter)
		}
		// The lock timeout is StoreTimeout/2; allow for a slow machine, but
		// the wait must end on the database's side well before the broker's.
		if took > 4*storeTimeout {
			t.Errorf("copy behind the held record took %v, want about %v", took, storeTimeout/2)
		}
		t.Logf("copy behind the held record gave up after %v", took)
		batch := []idem.Message{{ID: "m-0", Payload: []byte("p")}, msg}
		outs, err := c.ProcessBatch(b.ctx, batch, func(ctx context.Context, tx TTx, ms []idem.Message) error {
			t.Errorf("batch handler ran with %d messages while a record was held", len(ms))
			return nil
		})
		for i, o := range outs {
			if o.Status != idem.InProgress || !errors.Is(o.Err, idem.ErrLockTimeout) {
				t.Errorf("batch behind the held record, message %q: %v (%v), want InProgress matching ErrLockTimeout", batch[i].ID, o.Status, o.Err)
			}
		}
		if err == nil {
			t.Error("batch behind the held record returned no error")
		}
	} else {
		b.wantOutcome("copy behind the held record (store without claim waits)", msg.ID, out, err, idem.Failed, idem.ErrStore)
	}
	close(release)
	r := <-first
	b.wantOutcome("the holder", msg.ID, r.out, r.err, idem.Processed, nil)
	b.process("redelivery after the holder committed", c, msg, ok, idem.Duplicate, nil)
	b.wantCalls("after the redelivery", &calls, 1)
	b.wantEffects("after the redelivery", c.Name(), msg.ID, 1)
	b.wantRecords("after the redelivery", c.Name(), 1)
}

package idemtest

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

func deadlineCases[TTx any]() []testCase[TTx] {
	return []testCase[TTx]{
		{"ClaimLockTimeout", testClaimLockTimeout[TTx]},
		{"BeginStalls", forEachClaimPath(stallCase[TTx](faultBegin, 0))},
		{"ClaimStalls", forEachClaimPath(stallCase[TTx](faultClaim, 0))},
		{"CommitStalls", forEachClaimPath(stallCase[TTx](faultCommit, 1))},
		{"HandlerOutlivesStoreTimeout", testHandlerOutlivesStoreTimeout[TTx]},
	}
}

// stallTimeout is the StoreTimeout of the stall cases: short, but long
// enough for a healthy store's calls on a loaded test machine.
const stallTimeout = 2 * time.Second

// stallCase returns the case in which the store call of kind k stalls (a
// connection that stopped answering; the call returns only when its
// context ends): the delivery fails after StoreTimeout with an error
// matching ErrStore and ErrStoreTimeout, not after the caller's context,
// having run the handler calls times (fewer if an earlier store call
// outlasted StoreTimeout first); nothing is recorded, and the redelivery
// is processed once.
func stallCase[TTx any](k fault, calls int64) func(t *testing.T, b *bundle[TTx], store idemdriver.TxStore[TTx], f *faultStore[TTx]) {
	return func(t *testing.T, b *bundle[TTx], store idemdriver.TxStore[TTx], f *faultStore[TTx]) {
		c := b.consumerOn(store, "c", idem.Config{StoreTimeout: stallTimeout})
		runs := calls // the handler runs this delivery makes
		var n atomic.Int64
		h := b.handler(c, &n)
		msg := idem.Message{ID: "m-1", Payload: []byte("p")}
		f.armStall(k)
		start := time.Now()
		out, err := c.Process(b.ctx, msg, h) // b.ctx ends minutes later
		took := time.Since(start)
		b.wantOutcome("delivery whose store call stalls", msg.ID, out, err, idem.Failed, idem.ErrStore)
		if !errors.Is(err, idem.ErrStoreTimeout) || idem.IsPermanent(err) {
			t.Errorf("delivery whose store call stalls: err = %v, want a retryable error matching ErrStoreTimeout", err)
		}
		if f.fired[k].Load() != 1 {
			if !errors.Is(err, idem.ErrStoreTimeout) {
				t.Fatalf("the stall did not fire; the Consumer took another path")
			}
			// The store's own call outlasted StoreTimeout before the stall
			// could fire (a loaded machine): the same outcome, checked above.
			// When that call came before the handler (Begin or the claim,
			// ahead of a stalled Commit), the handler did not run.
			t.Logf("the store call itself took longer than StoreTimeout (%v); the handler ran %d times", stallTimeout, n.Load())
			f.armed[k].Store(false)
			runs = min(runs, n.Load())
		}
		f.stall.Store(false)
		if took < stallTimeout || took > blockTimeout {
			t.Errorf("delivery whose store call stalls returned after %v, want StoreTimeout (%v)", took, stallTimeout)
		}
		b.wantCalls("after the stall", &n, runs)
		b.wantRecords("after the stall", c.Name(), 0)
		b.process("redelivery after the stall", c, msg, h, idem.Processed, nil)
		b.wantCalls("after the redelivery", &n, runs+1)
		b.wantEffects("after the redelivery", c.Name(), msg.ID, 1)
	}
}

// StoreTimeout bounds the store calls, not the handler: a handler that
// runs for several StoreTimeouts inside the transaction (database/sql ties
// the transaction to the context it began with) commits.
func testHandlerOutlivesStoreTimeout[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{StoreTimeout: stallTimeout})
	var n atomic.Int64
	h := b.handler(c, &n)
	slow := func(ctx context.Context, tx TTx, msg idem.Message) error {
		select {
		case <-time.After(2 * stallTimeout): // the handler's own work
		case <-ctx.Done():
			return ctx.Err()
		}
		return h(ctx, tx, msg)
	}
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}
	b.process("delivery with a handler slower than StoreTimeout", c, msg, slow, idem.Processed, nil)
	b.wantEffects("after the slow handler", c.Name(), msg.ID, 1)
	b.process("redelivery", c, msg, h, idem.Duplicate, nil)
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

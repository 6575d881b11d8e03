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

func mixedCases[TTx any]() []testCase[TTx] {
	return []testCase[TTx]{
		{"LeaseRecordNeverAcked", testLeaseRecordNeverAcked[TTx]},
	}
}

// A store with both claim modes: a transactional Consumer must never
// acknowledge a message whose record a LeaseConsumer of the same name holds
// in progress or has poisoned. The single, in-transaction and batch claims
// all report the record's state; the handler does not run and writes
// nothing. Stores without lease mode skip this case.
func testLeaseRecordNeverAcked[TTx any](t *testing.T, b *bundle[TTx]) {
	ls, ok := any(b.s.Store).(idemdriver.LeaseStore)
	if !ok {
		t.Skip("the store has no lease mode")
	}
	c := b.consumer("mixed", idem.Config{})
	lc, err := idem.NewLeaseConsumer(ls, idem.Config{Name: c.Name(), PurgeInterval: -1, MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lc.Close() })

	var calls atomic.Int64
	handler := b.handler(c, &calls)
	batch := b.batchHandler(c, &batchCalls{})
	wantInProgress := func(what string, out idem.Outcome, err error) {
		t.Helper()
		if out.Status != idem.InProgress || !errors.Is(err, idem.ErrInProgress) || !errors.Is(out.Err, idem.ErrInProgress) ||
			out.Ack() || out.RetryAfter != time.Second {
			t.Errorf("%s of a lease-mode message in progress: %+v, %v; want InProgress, ErrInProgress, RetryAfter 1s, no ack", what, out, err)
		}
	}
	wantPoison := func(what string, out idem.Outcome, err error) {
		t.Helper()
		if out.Status != idem.Failed || !out.Poison || !errors.Is(err, idem.ErrPoison) || out.Ack() || !out.DeadLetter() {
			t.Errorf("%s of a poisoned lease-mode message: %+v, %v; want Failed, Poison, ErrPoison, dead letter", what, out, err)
		}
	}

	msg := idem.Message{ID: "m", Payload: []byte("p")}
	started, release, done := make(chan struct{}), make(chan struct{}), make(chan idem.Outcome, 1)
	go func() {
		out, _ := lc.Process(b.ctx, msg, func(context.Context, *idem.Attempt) (idem.Result, error) {
			close(started)
			<-release
			return idem.Result{Body: []byte("r")}, nil
		})
		done <- out
	}()
	<-started
	// Release the lease consumer on every exit, so it never outlives the test.
	var released atomic.Bool
	finish := func() idem.Outcome {
		if released.CompareAndSwap(false, true) {
			close(release)
		}
		return <-done
	}
	defer func() {
		if !released.Load() {
			finish()
		}
	}()

	out, err := c.Process(b.ctx, msg, handler)
	wantInProgress("Process", out, err)
	tx := b.begin()
	out, err = c.ProcessTx(b.ctx, tx, msg, handler)
	wantInProgress("ProcessTx", out, err)
	b.rollback(tx)
	outs, err := c.ProcessBatch(b.ctx, []idem.Message{msg, {ID: "n", Payload: []byte("n")}, msg}, batch)
	if !errors.Is(err, idem.ErrInProgress) || len(outs) != 3 || outs[1].Status != idem.Processed {
		t.Errorf("ProcessBatch: %+v, %v; want m InProgress, n Processed", outs, err)
	} else {
		wantInProgress("ProcessBatch", outs[0], outs[0].Err)
		wantInProgress("ProcessBatch (repeat)", outs[2], outs[2].Err)
	}
	out, err = c.Process(b.ctx, idem.Message{ID: "m", Payload: []byte("other")}, handler)
	if out.Status != idem.FingerprintMismatch || !errors.Is(err, idem.ErrFingerprintMismatch) {
		t.Errorf("Process with another payload: %+v, %v; want FingerprintMismatch first", out, err)
	}
	b.wantCalls("while the lease consumer holds m", &calls, 0)
	b.wantEffects("while the lease consumer holds m", c.Name(), "m", 0)
	b.wantEffects("the batch's new message", c.Name(), "n", 1)

	if out := finish(); out.Status != idem.Processed {
		t.Fatalf("LeaseConsumer.Process: %+v", out)
	}
	b.process("after the lease consumer completed", c, msg, handler, idem.Duplicate, nil)

	poison := idem.Message{ID: "poison", Payload: []byte("x")}
	out, err = lc.Process(b.ctx, poison, func(context.Context, *idem.Attempt) (idem.Result, error) {
		return idem.Result{}, idem.Permanent(errors.New("bad"))
	})
	if !out.Poison {
		t.Fatalf("LeaseConsumer.Process of a poison message: %+v, %v", out, err)
	}
	out, err = c.Process(b.ctx, poison, handler)
	wantPoison("Process", out, err)
	tx = b.begin()
	out, err = c.ProcessTx(b.ctx, tx, poison, handler)
	wantPoison("ProcessTx", out, err)
	b.rollback(tx)
	outs, err = c.ProcessBatch(b.ctx, []idem.Message{poison, poison}, batch)
	if !errors.Is(err, idem.ErrPoison) || len(outs) != 2 {
		t.Errorf("ProcessBatch of a poisoned message: %+v, %v", outs, err)
	} else {
		wantPoison("ProcessBatch", outs[0], outs[0].Err)
		wantPoison("ProcessBatch (repeat)", outs[1], outs[1].Err)
	}
	b.wantCalls("after the poison deliveries", &calls, 0)
	b.wantEffects("after the poison deliveries", c.Name(), "poison", 0)
}

package idempgxv5_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/jackc/pgx/v5"
)

// mixedStore is a store with both claim modes.
type mixedStore[TTx any] interface {
	idem.LeaseStore
	idem.TxStore[TTx]
}

// runMixedMode checks that a transactional Consumer never acknowledges a
// message whose record a LeaseConsumer of the same name holds in progress
// or has poisoned: the single, in-transaction and batch claims all report
// the record's state. write writes one side effect keyed by the message
// ID; effects counts them.
func runMixedMode[TTx any](t *testing.T, store mixedStore[TTx], write func(context.Context, TTx, string) error, effects func(id string) int) {
	ctx := t.Context()
	lc, err := idem.NewLeaseConsumer(store, idem.Config{Name: "mixed", PurgeInterval: -1, MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	c, err := idem.NewConsumer[TTx](store, idem.Config{Name: "mixed", PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	var calls atomic.Int32
	handler := func(ctx context.Context, tx TTx, msg idem.Message) error {
		calls.Add(1)
		return write(ctx, tx, msg.ID)
	}
	batchHandler := func(ctx context.Context, tx TTx, msgs []idem.Message) error {
		for _, m := range msgs {
			calls.Add(1)
			if err := write(ctx, tx, m.ID); err != nil {
				return err
			}
		}
		return nil
	}
	wantInProgress := func(what string, out idem.Outcome, err error) {
		t.Helper()
		if out.Status != idem.InProgress || !errors.Is(err, idem.ErrInProgress) || out.Ack() || out.RetryAfter != time.Second {
			t.Errorf("%s of a lease-mode message in progress: %+v, %v; want InProgress, ErrInProgress, RetryAfter 1s", what, out, err)
		}
	}
	wantPoison := func(what string, out idem.Outcome, err error) {
		t.Helper()
		if out.Status != idem.Failed || !out.Poison || !errors.Is(err, idem.ErrPoison) || out.Ack() {
			t.Errorf("%s of a poisoned lease-mode message: %+v, %v; want Failed, Poison, ErrPoison", what, out, err)
		}
	}

	msg := idem.Message{ID: "m", Payload: []byte("p")}
	started, release, done := make(chan struct{}), make(chan struct{}), make(chan idem.Outcome, 1)
	go func() {
		out, _ := lc.Process(ctx, msg, func(context.Context, *idem.Attempt) (idem.Result, error) {
			close(started)
			<-release
			return idem.Result{Body: []byte("r")}, nil
		})
		done <- out
	}()
	<-started
	// Release the lease consumer on every exit, so it never outlives the test.
	var releaseOnce atomic.Bool
	finish := func() idem.Outcome {
		if releaseOnce.CompareAndSwap(false, true) {
			close(release)
		}
		return <-done
	}
	defer func() {
		if !releaseOnce.Load() {
			finish()
		}
	}()

	out, err := c.Process(ctx, msg, handler)
	wantInProgress("Process", out, err)
	tx, err := store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out, err = c.ProcessTx(ctx, tx, msg, handler)
	wantInProgress("ProcessTx", out, err)
	if err := store.Rollback(ctx, tx); err != nil {
		t.Fatal(err)
	}
	outs, err := c.ProcessBatch(ctx, []idem.Message{msg, {ID: "n", Payload: []byte("n")}, msg}, batchHandler)
	if !errors.Is(err, idem.ErrInProgress) || len(outs) != 3 || outs[1].Status != idem.Processed {
		t.Errorf("ProcessBatch: %+v, %v; want m InProgress, n Processed", outs, err)
	} else {
		wantInProgress("ProcessBatch", outs[0], outs[0].Err)
		wantInProgress("ProcessBatch (repeat)", outs[2], outs[2].Err)
	}
	out, err = c.Process(ctx, idem.Message{ID: "m", Payload: []byte("other")}, handler)
	if out.Status != idem.FingerprintMismatch || !errors.Is(err, idem.ErrFingerprintMismatch) {
		t.Errorf("Process with another payload: %+v, %v; want FingerprintMismatch first", out, err)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("handler calls = %d, want 1 (the batch's new message)", n)
	}
	if n := effects("m"); n != 0 {
		t.Errorf("effects of the in-progress message = %d, want 0", n)
	}

	if out := finish(); out.Status != idem.Processed {
		t.Fatalf("LeaseConsumer.Process: %+v", out)
	}
	out, err = c.Process(ctx, msg, handler)
	if err != nil || out.Status != idem.Duplicate {
		t.Errorf("Process after the lease consumer completed: %+v, %v; want Duplicate", out, err)
	}

	poison := idem.Message{ID: "poison", Payload: []byte("x")}
	out, err = lc.Process(ctx, poison, func(context.Context, *idem.Attempt) (idem.Result, error) {
		return idem.Result{}, idem.Permanent(errors.New("bad"))
	})
	if !out.Poison {
		t.Fatalf("LeaseConsumer.Process of a poison message: %+v, %v", out, err)
	}
	out, err = c.Process(ctx, poison, handler)
	wantPoison("Process", out, err)
	tx, err = store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out, err = c.ProcessTx(ctx, tx, poison, handler)
	wantPoison("ProcessTx", out, err)
	if err := store.Rollback(ctx, tx); err != nil {
		t.Fatal(err)
	}
	outs, err = c.ProcessBatch(ctx, []idem.Message{poison, poison}, batchHandler)
	if !errors.Is(err, idem.ErrPoison) || len(outs) != 2 {
		t.Errorf("ProcessBatch of a poisoned message: %+v, %v", outs, err)
	} else {
		wantPoison("ProcessBatch", outs[0], outs[0].Err)
		wantPoison("ProcessBatch (repeat)", outs[1], outs[1].Err)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("handler calls = %d, want 1", n)
	}
	if n := effects("poison"); n != 0 {
		t.Errorf("effects of the poisoned message = %d, want 0", n)
	}
}

func TestMixedModeConsumer(t *testing.T) {
	t.Parallel()
	b := setup(t, poolOpts{})
	runMixedMode[pgx.Tx](t, b.store, b.writeEffect, func(id string) int { return b.countEffects(t, id) })
}

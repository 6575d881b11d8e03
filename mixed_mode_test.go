package idem_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// TestMixedModeTxConsumer checks that a transactional Consumer never
// acknowledges a message whose record a LeaseConsumer of the same name
// holds in progress or has poisoned.
func TestMixedModeTxConsumer(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	store := idem.NewMemoryStore(nil)
	lc, err := idem.NewLeaseConsumer(store, idem.Config{Name: "c", PurgeInterval: -1, MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	c, err := idem.NewConsumer[*idem.MemoryTx](store, idem.Config{Name: "c", PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	var calls atomic.Int32
	handler := func(context.Context, *idem.MemoryTx, idem.Message) error {
		calls.Add(1)
		return nil
	}
	batchHandler := func(_ context.Context, _ *idem.MemoryTx, msgs []idem.Message) error {
		calls.Add(int32(len(msgs)))
		return nil
	}
	wantInProgress := func(what string, out idem.Outcome, err error) {
		t.Helper()
		if out.Status != idem.InProgress || !errors.Is(err, idem.ErrInProgress) || !errors.Is(out.Err, idem.ErrInProgress) ||
			out.Ack() || out.RetryAfter != time.Second {
			t.Errorf("%s of a lease-mode message in progress: %+v, %v; want InProgress, ErrInProgress, RetryAfter 1s", what, out, err)
		}
	}
	wantPoison := func(what string, out idem.Outcome, err error) {
		t.Helper()
		if out.Status != idem.Failed || !out.Poison || !errors.Is(err, idem.ErrPoison) || out.Ack() || !out.DeadLetter() {
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
	// A fingerprint mismatch is still reported first.
	out, err = c.Process(ctx, idem.Message{ID: "m", Payload: []byte("other")}, handler)
	if out.Status != idem.FingerprintMismatch || !errors.Is(err, idem.ErrFingerprintMismatch) {
		t.Errorf("Process with another payload: %+v, %v; want FingerprintMismatch", out, err)
	}
	if n := calls.Load(); n != 1 { // "n" only
		t.Errorf("handler calls = %d, want 1 (the batch's new message)", n)
	}

	close(release)
	if out := <-done; out.Status != idem.Processed {
		t.Fatalf("LeaseConsumer.Process: %+v", out)
	}
	out, err = c.Process(ctx, msg, handler)
	if err != nil || out.Status != idem.Duplicate {
		t.Errorf("Process after the lease consumer completed: %+v, %v; want Duplicate", out, err)
	}

	// A poisoned lease-mode record.
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
}

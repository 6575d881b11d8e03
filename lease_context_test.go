package idem_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
)

// LeaseContext ignores the caller's cancellation and ends with the
// attempt, with cause ErrAttemptEnded, whether it was asked for before
// the attempt ended or after.
func TestLeaseContextEndsWithAttempt(t *testing.T) {
	c := leaseConsumer(t, idem.NewMemoryStore(nil), time.Minute)
	ctx, cancel := context.WithCancel(t.Context())
	a, out, err := c.Acquire(ctx, idem.Message{ID: "m-1", Payload: []byte("p")}, idem.AcquireOptions{})
	if a == nil {
		t.Fatalf("Acquire: %v %v", out, err)
	}
	lc := a.LeaseContext()
	if lc != a.LeaseContext() {
		t.Error("LeaseContext returned another context on its second call")
	}
	cancel()
	if a.Context().Err() == nil {
		t.Error("Context not cancelled with the caller's context")
	}
	if lc.Err() != nil {
		t.Errorf("LeaseContext cancelled with the caller's context: %v", context.Cause(lc))
	}
	if out, err := a.Complete(context.WithoutCancel(ctx), idem.Result{Body: []byte("ok")}); err != nil || out.Status != idem.Processed {
		t.Fatalf("Complete: %v %v", out.Status, err)
	}
	if err := context.Cause(lc); !errors.Is(err, idem.ErrAttemptEnded) {
		t.Errorf("LeaseContext after Complete: cause %v, want ErrAttemptEnded", err)
	}

	b, out, err := c.Acquire(t.Context(), idem.Message{ID: "m-2", Payload: []byte("p")}, idem.AcquireOptions{})
	if b == nil {
		t.Fatalf("Acquire: %v %v", out, err)
	}
	if out, err := b.Complete(t.Context(), idem.Result{}); err != nil || out.Status != idem.Processed {
		t.Fatalf("Complete: %v %v", out.Status, err)
	}
	if err := context.Cause(b.LeaseContext()); !errors.Is(err, idem.ErrAttemptEnded) {
		t.Errorf("LeaseContext first asked for after Complete: cause %v, want ErrAttemptEnded", err)
	}
}

// An attempt whose lease ran out by the local clock (no renewal landed)
// has both contexts cancelled with cause ErrLeaseLost, LeaseContext too
// when it is first asked for afterwards, and Valid reports ErrLeaseLost
// without asking the store.
func TestLeaseContextAfterLocalExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = time.Second
		store := &stallStore{MemoryStore: idem.NewMemoryStore(nil)}
		c := leaseConsumer(t, store, lease)
		a, out, err := c.Acquire(t.Context(), idem.Message{ID: "m-1", Payload: []byte("p")}, idem.AcquireOptions{})
		if a == nil {
			t.Fatalf("Acquire: %v %v", out, err)
		}
		store.stalled.Store(true)
		<-a.Context().Done()
		if err := context.Cause(a.Context()); !errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("Context: cause %v, want ErrLeaseLost", err)
		}
		if err := context.Cause(a.LeaseContext()); !errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("LeaseContext first asked for after the lease ran out: cause %v, want ErrLeaseLost", err)
		}
		if err := a.Valid(t.Context()); !errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("Valid after the lease ran out: %v, want ErrLeaseLost", err)
		}
		store.stalled.Store(false)
		gaveUp := errors.New("gave up")
		if out, err := a.Release(t.Context(), gaveUp); !errors.Is(err, gaveUp) || out.Status != idem.Failed {
			t.Errorf("Release: %v %v, want Failed with the error given", out.Status, err)
		}
	})
}

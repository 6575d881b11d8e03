package idem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// TestBreakStepEndedContext: Attempt.Step called on a context that has
// already ended (a broker's handler timeout) does not call its function,
// whose result could not be saved on that context (a function deaf to
// its context would make its effect and the next attempt make it again),
// and returns the context's cause; on a live context the step then runs
// once and its result is saved.
func TestBreakStepEndedContext(t *testing.T) {
	c := leaseConsumer(t, idem.NewMemoryStore(nil), 3*time.Second)
	a, out, err := c.Acquire(t.Context(), idem.Message{ID: "m-1", Payload: []byte("p")}, idem.AcquireOptions{})
	if a == nil {
		t.Fatalf("Acquire: %v %v", out, err)
	}
	calls := 0
	fn := func(context.Context) ([]byte, error) { calls++; return []byte("r"), nil }
	ended, cancel := context.WithTimeout(t.Context(), time.Nanosecond)
	<-ended.Done()
	cancel()
	if _, err := a.Step(ended, "effect", fn); !errors.Is(err, context.DeadlineExceeded) || calls != 0 {
		t.Fatalf("Step on an ended context: %v, %d calls; want its cause and no call", err, calls)
	}
	if res, err := a.Step(t.Context(), "effect", fn); err != nil || string(res) != "r" || calls != 1 {
		t.Fatalf("Step: %q %v, %d calls; want r, one call", res, err, calls)
	}
	if res, err := a.Step(t.Context(), "effect", fn); err != nil || string(res) != "r" || calls != 1 {
		t.Fatalf("Step again: %q %v, %d calls; want its saved r, no new call", res, err, calls)
	}
	if _, err := a.Complete(t.Context(), idem.Result{}); err != nil {
		t.Fatal(err)
	}
}

// TestBreakStepContextEndsWhileRunning: a step function deaf to its
// context, whose context ends while it runs, makes its effect and returns
// its result: Step records the recovery point anyway (the lease is still
// held), so the next attempt returns the saved result without calling
// its function again.
func TestBreakStepContextEndsWhileRunning(t *testing.T) {
	store := idem.NewMemoryStore(nil)
	c := leaseConsumer(t, store, 3*time.Second)
	a, out, err := c.Acquire(t.Context(), idem.Message{ID: "m-1", Payload: []byte("p")}, idem.AcquireOptions{})
	if a == nil {
		t.Fatalf("Acquire: %v %v", out, err)
	}
	calls := 0
	ctx, cancel := context.WithCancel(t.Context())
	deaf := func(context.Context) ([]byte, error) { calls++; cancel(); return []byte("r"), nil }
	if res, err := a.Step(ctx, "effect", deaf); err != nil || string(res) != "r" || calls != 1 {
		t.Fatalf("Step whose context ended while it ran: %q %v, %d calls; want r saved, one call", res, err, calls)
	}
	again := errors.New("try again")
	if _, err := a.Release(t.Context(), again); err != nil && !errors.Is(err, again) {
		t.Fatal(err)
	}
	b, out, err := c.Acquire(t.Context(), idem.Message{ID: "m-1", Payload: []byte("p")}, idem.AcquireOptions{})
	if b == nil {
		t.Fatalf("Acquire again: %v %v", out, err)
	}
	if res, err := b.Step(t.Context(), "effect", deaf); err != nil || string(res) != "r" || calls != 1 {
		t.Fatalf("the next attempt's Step: %q %v, %d calls; want the saved r and no new call", res, err, calls)
	}
	if _, err := b.Complete(t.Context(), idem.Result{}); err != nil {
		t.Fatal(err)
	}
}

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

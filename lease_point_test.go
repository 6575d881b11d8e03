package idem_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// TestAcquireStepPrefixInSteps holds the recovery point that an Acquire
// with AcquireOptions.StepPrefix saved in the store's own write (a
// StepRecorder: the memory store) to being one of the attempt's steps,
// whichever way they are read first (Completed, Steps, Step, SaveStep),
// with an empty result; and the attempt that takes the message over to
// finding it.
func TestAcquireStepPrefixInSteps(t *testing.T) {
	ctx := context.Background()
	for _, first := range []string{"Completed", "Steps", "Step", "SaveStep"} {
		t.Run(first, func(t *testing.T) {
			var mu sync.Mutex
			clock := time.Unix(1_700_000_000, 0)
			store := idem.NewMemoryStore(func() time.Time { mu.Lock(); defer mu.Unlock(); return clock })
			c := leaseConsumer(t, store, time.Minute)
			a, _, err := c.Acquire(ctx, idem.Message{ID: "m", Payload: []byte("p")}, idem.AcquireOptions{StepPrefix: "run:"})
			if err != nil || a == nil {
				t.Fatalf("Acquire: %v", err)
			}
			point := idemdriver.PrefixStep("run:", a.Token)
			switch first {
			case "Completed":
				if !a.Completed(point) {
					t.Fatalf("Completed(%q) = false, want true", point)
				}
			case "Steps":
			case "Step":
				res, err := a.Step(ctx, point, func(context.Context) ([]byte, error) {
					t.Fatal("the step of the saved point ran")
					return nil, nil
				})
				if err != nil || len(res) != 0 {
					t.Fatalf("Step(%q) = %q, %v; want its empty result", point, res, err)
				}
			case "SaveStep":
				if err := a.SaveStep(ctx, "other", []byte("x")); err != nil {
					t.Fatal(err)
				}
			}
			steps := a.Steps()
			if res, ok := steps[point]; !ok || len(res) != 0 {
				t.Fatalf("Steps() = %q, want %q with an empty result", steps, point)
			}
			if first == "SaveStep" && (len(steps) != 2 || string(steps["other"]) != "x") {
				t.Fatalf("Steps() = %q, want the point and other=x", steps)
			}
			if !a.Completed(point) {
				t.Fatalf("Completed(%q) = false after Steps", point)
			}
			// The next attempt (this one abandoned, its lease run out by
			// the store's clock) finds the point among the earlier steps.
			if _, err := a.Abandon(ctx, nil); err == nil {
				t.Fatal("Abandon: nil error, want the abandonment's")
			}
			mu.Lock()
			clock = clock.Add(2 * time.Minute)
			mu.Unlock()
			b, _, err := c.Acquire(ctx, idem.Message{ID: "m", Payload: []byte("p")}, idem.AcquireOptions{})
			if err != nil || b == nil {
				t.Fatalf("second Acquire: %v", err)
			}
			if !b.Completed(point) || b.Number != 2 {
				t.Fatalf("takeover sees steps %q, attempt %d; want %q, attempt 2", b.Steps(), b.Number, point)
			}
			_, _ = b.Abandon(ctx, nil)
		})
	}
}

package idem_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
)

// TestBreakStepLocalDeadlineWhileRunning: a step function runs while the
// attempt's renewals stop landing (the store does not answer them), its
// context ends at the lease's local deadline, and it returns its result
// anyway (the effect is made). No other attempt has taken the record
// over, so the store's fencing still accepts the recovery point under
// this attempt's token: Step must save it (on a detached context, as for
// any context that ends while the function runs), and the attempt that
// takes over once the store's lease has run out returns the saved result
// without making the effect again.
func TestBreakStepLocalDeadlineWhileRunning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = time.Second
		store, _, c2, msg, a := stalledAttempt(t, lease)
		effects := 0
		// Deaf to everything but its context's end: it makes its effect
		// and returns once the local deadline has cancelled the context.
		deaf := func(ctx context.Context) ([]byte, error) {
			store.stalled.Store(true) // no renewal lands from now on
			<-ctx.Done()
			effects++
			return []byte("r"), nil
		}
		res, err := a.Step(a.Context(), "effect", deaf)
		if cause := context.Cause(a.Context()); !errors.Is(cause, idem.ErrLeaseLost) {
			t.Fatalf("the attempt's context ended with %v, want ErrLeaseLost (the local deadline)", cause)
		}
		t.Logf("Step after the local deadline: %q, %v", res, err)
		if err != nil || string(res) != "r" {
			t.Errorf("Step = %q, %v; want r saved (no attempt took over: the store's fencing accepts it)", res, err)
		}
		store.stalled.Store(false)

		time.Sleep(lease) // the store's lease has run out too
		b, out, err := c2.Acquire(t.Context(), msg, idem.AcquireOptions{})
		switch {
		case b != nil:
			again := func(context.Context) ([]byte, error) { effects++; return []byte("r2"), nil }
			if _, err := b.Step(b.Context(), "effect", again); err != nil {
				t.Fatalf("the next attempt's Step: %v", err)
			}
			if _, err := b.Complete(t.Context(), idem.Result{}); err != nil {
				t.Fatal(err)
			}
		case out.Status != idem.Duplicate:
			t.Fatalf("the next Acquire: %v %v; want a takeover or a duplicate", out, err)
		}
		if effects != 1 {
			t.Errorf("the effect was made %d times, want once (its recovery point could be saved)", effects)
		}
		_, _ = a.Abandon(t.Context(), nil)
	})
}

// TestBreakStepStaleSaveRefused: a step function outlives its attempt's
// lease (renewals stalled), another attempt takes the record over, makes
// the step and saves its result; then the first function returns its
// own. Its save, sent to the store although the local deadline has
// passed, is refused by the fencing token: Step returns ErrLeaseLost, the
// saved result stays the new owner's, and the stale attempt's Complete is
// refused too.
func TestBreakStepStaleSaveRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = time.Second
		store, c1, c2, msg, a := stalledAttempt(t, lease)
		release := make(chan struct{})
		var (
			staleErr error
			done     = make(chan struct{})
		)
		go func() {
			defer close(done)
			_, staleErr = a.Step(t.Context(), "effect", func(context.Context) ([]byte, error) {
				store.stalled.Store(true)
				<-release // outlives the lease
				return []byte("a"), nil
			})
		}()
		time.Sleep(lease + lease/2)
		synctest.Wait()
		b, out, err := c2.Acquire(t.Context(), msg, idem.AcquireOptions{})
		if b == nil {
			t.Fatalf("takeover: %v %v", out, err)
		}
		if res, err := b.Step(b.Context(), "effect", func(context.Context) ([]byte, error) { return []byte("b"), nil }); err != nil || string(res) != "b" {
			t.Fatalf("the new owner's Step: %q %v", res, err)
		}
		close(release)
		<-done
		if !errors.Is(staleErr, idem.ErrLeaseLost) {
			t.Errorf("the stale attempt's Step: %v; want ErrLeaseLost (its save refused by the token)", staleErr)
		}
		if out, err := a.Complete(t.Context(), idem.Result{Body: []byte("a")}); !errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("the stale attempt's Complete: %v %v; want ErrLeaseLost", out, err)
		}
		if out, err := b.Complete(t.Context(), idem.Result{Body: []byte("b")}); err != nil || out.Status != idem.Processed {
			t.Fatalf("the new owner's Complete: %v %v", out, err)
		}
		store.stalled.Store(false)
		out, err = c1.Process(t.Context(), msg, func(context.Context, *idem.Attempt) (idem.Result, error) {
			t.Error("handler ran for a completed message")
			return idem.Result{}, nil
		})
		if err != nil || out.Status != idem.Duplicate || string(out.Result) != "b" {
			t.Fatalf("redelivery: %v %v; want the new owner's result", out, err)
		}
	})
}

// stalledAttempt returns a store whose renewals can be stalled, a lease
// consumer on it (c1) and one on the memory store beneath (c2), both at
// lease, and c1's attempt at msg.
func stalledAttempt(t *testing.T, lease time.Duration) (store *stallStore, c1, c2 *idem.LeaseConsumer, msg idem.Message, a *idem.Attempt) {
	t.Helper()
	store = &stallStore{MemoryStore: idem.NewMemoryStore(nil)}
	c1 = leaseConsumer(t, store, lease)
	c2 = leaseConsumer(t, store.MemoryStore, lease)
	msg = idem.Message{ID: "m-1", Payload: []byte("p")}
	a, out, err := c1.Acquire(t.Context(), msg, idem.AcquireOptions{})
	if a == nil {
		t.Fatalf("Acquire: %v %v", out, err)
	}
	return store, c1, c2, msg, a
}

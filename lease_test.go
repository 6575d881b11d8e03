package idem_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// stallStore is the memory store whose renewals can be made to hang until
// their context ends, as when the process is paused (a stop signal, a long
// GC pause) or cut off from the store: no renewal lands.
type stallStore struct {
	*idem.MemoryStore
	stalled atomic.Bool
}

func (s *stallStore) Renew(ctx context.Context, p *idemdriver.RenewParams) error {
	if s.stalled.Load() {
		<-ctx.Done()
		return ctx.Err()
	}
	return s.MemoryStore.Renew(ctx, p)
}

// RenewsBatches is false: the scheduler sends its renewals one by one,
// through Renew above, not through the memory store's RenewBatch.
func (s *stallStore) RenewsBatches() bool { return false }

func leaseConsumer(t *testing.T, store idemdriver.LeaseStore, lease time.Duration) *idem.LeaseConsumer {
	t.Helper()
	c, err := idem.NewLeaseConsumer(store, idem.Config{Name: "c", Lease: lease, PurgeInterval: -1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("NewLeaseConsumer: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// An attempt whose renewals stop landing for longer than its lease (the
// process was paused) and whose message another attempt took over does
// not run its next step when it wakes: Step reports ErrLeaseLost (not
// ErrStore) without calling the step's function, and the new owner's
// result is the one stored.
func TestStepNotRunAfterLocalDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = time.Second
		mem := idem.NewMemoryStore(nil)
		store := &stallStore{MemoryStore: mem}
		c1 := leaseConsumer(t, store, lease)
		c2 := leaseConsumer(t, mem, lease)
		msg := idem.Message{ID: "m-1", Payload: []byte("p")}

		a, out, err := c1.Acquire(t.Context(), msg, idem.AcquireOptions{})
		if a == nil {
			t.Fatalf("Acquire: %v %v", out, err)
		}
		var ran []string
		step := func(name string) func(context.Context) ([]byte, error) {
			return func(context.Context) ([]byte, error) { ran = append(ran, name); return []byte(name), nil }
		}
		if _, err := a.Step(a.Context(), "one", step("one")); err != nil {
			t.Fatalf("step one: %v", err)
		}
		store.stalled.Store(true)
		time.Sleep(2 * lease) // paused: nothing reaches the store
		synctest.Wait()
		if err := context.Cause(a.Context()); !errors.Is(err, idem.ErrLeaseLost) {
			t.Fatalf("attempt context cause = %v, want ErrLeaseLost", err)
		}
		if !a.Deadline().Before(time.Now()) {
			t.Fatalf("Deadline %v is not past at %v", a.Deadline(), time.Now())
		}
		b, out, err := c2.Acquire(t.Context(), msg, idem.AcquireOptions{})
		if b == nil {
			t.Fatalf("takeover: %v %v", out, err)
		}
		if !b.Completed("one") || b.Number != 2 {
			t.Fatalf("takeover sees steps %v, attempt %d", b.Steps(), b.Number)
		}
		store.stalled.Store(false)
		_, err = a.Step(a.Context(), "two", step("two"))
		if !errors.Is(err, idem.ErrLeaseLost) || errors.Is(err, idem.ErrStore) {
			t.Fatalf("step two after the pause: %v, want ErrLeaseLost and not ErrStore", err)
		}
		if err := a.Valid(t.Context()); !errors.Is(err, idem.ErrLeaseLost) {
			t.Fatalf("Valid = %v, want ErrLeaseLost", err)
		}
		if _, err := b.Step(b.Context(), "two", step("two-b")); err != nil {
			t.Fatalf("new owner's step two: %v", err)
		}
		if out, err := b.Complete(t.Context(), idem.Result{Body: []byte("b")}); err != nil || out.Status != idem.Processed {
			t.Fatalf("new owner's Complete: %v %v", out, err)
		}
		if out, err := a.Complete(t.Context(), idem.Result{Body: []byte("a")}); !errors.Is(err, idem.ErrLeaseLost) {
			t.Fatalf("stale Complete: %v %v, want ErrLeaseLost", out, err)
		}
		if want := []string{"one", "two-b"}; len(ran) != 2 || ran[0] != want[0] || ran[1] != want[1] {
			t.Fatalf("step functions ran: %v, want %v", ran, want)
		}
		out, err = c1.Process(t.Context(), msg, func(context.Context, *idem.Attempt) (idem.Result, error) {
			t.Error("handler ran for a completed message")
			return idem.Result{}, nil
		})
		if err != nil || out.Status != idem.Duplicate || string(out.Result) != "b" {
			t.Fatalf("redelivery: %v %v, want the new owner's result", out, err)
		}
	})
}

// The store's clock decides too: an attempt whose local deadline is still
// ahead but whose message was taken over (the store's lease ran out by
// the store's clock) does not run its next step.
func TestStepNotRunAfterStoreTakeover(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	storeNow := time.Now()
	mem := idem.NewMemoryStore(func() time.Time { mu.Lock(); defer mu.Unlock(); return storeNow })
	c1 := leaseConsumer(t, mem, time.Minute)
	c2 := leaseConsumer(t, mem, time.Minute)
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}
	a, out, err := c1.Acquire(t.Context(), msg, idem.AcquireOptions{})
	if a == nil {
		t.Fatalf("Acquire: %v %v", out, err)
	}
	defer a.Abandon(t.Context(), nil)
	mu.Lock()
	storeNow = storeNow.Add(2 * time.Minute)
	mu.Unlock()
	b, out, err := c2.Acquire(t.Context(), msg, idem.AcquireOptions{})
	if b == nil {
		t.Fatalf("takeover: %v %v", out, err)
	}
	defer b.Abandon(t.Context(), nil)
	if !time.Now().Before(a.Deadline()) {
		t.Fatal("the local deadline passed; the test needs it ahead")
	}
	ran := false
	_, err = a.Step(a.Context(), "charge", func(context.Context) ([]byte, error) { ran = true; return nil, nil })
	if ran || !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("step after a takeover: ran %v, err %v; want not run, ErrLeaseLost", ran, err)
	}
	if cause := context.Cause(a.Context()); !errors.Is(cause, idem.ErrLeaseLost) {
		t.Fatalf("context cause = %v, want ErrLeaseLost", cause)
	}
}

// A step whose function is cancelled because the lease was lost while it
// ran reports ErrLeaseLost (the context's cause), not the function's
// context.Canceled or an ErrStore from saving it.
func TestStepCancelledByLostLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = time.Second
		mem := idem.NewMemoryStore(nil)
		c1 := leaseConsumer(t, mem, lease)
		c2 := leaseConsumer(t, mem, lease)
		msg := idem.Message{ID: "m-1", Payload: []byte("p")}
		var takeover *idem.Attempt
		out, err := c1.Process(t.Context(), msg, func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
			_, err := a.Step(ctx, "call", func(ctx context.Context) ([]byte, error) {
				// The store forgets the lease (as if it ran out) and
				// another attempt takes over; the next renewal finds out.
				idem.ExpireLease(mem, "c", msg.ID)
				b, out, err := c2.Acquire(context.Background(), msg, idem.AcquireOptions{})
				if b == nil {
					t.Errorf("takeover: %v %v", out, err)
					return nil, errors.New("no takeover")
				}
				takeover = b
				<-ctx.Done()
				return nil, ctx.Err()
			})
			return idem.Result{}, err
		})
		if !errors.Is(err, idem.ErrLeaseLost) || errors.Is(err, idem.ErrStore) || out.Status != idem.Failed {
			t.Fatalf("Process = %v, %v; want Failed with ErrLeaseLost, not ErrStore", out, err)
		}
		if takeover == nil {
			t.Fatal("no takeover")
		}
		if takeover.Completed("call") {
			t.Fatal("the cancelled step was saved")
		}
		if out, err := takeover.Complete(t.Context(), idem.Result{Body: []byte("ok")}); err != nil {
			t.Fatalf("new owner's Complete: %v %v", out, err)
		}
	})
}

// Acquire returns a held lease that stays held while the caller works
// (its renewals run in the background) and ends with Complete; a second
// Acquire meanwhile is InProgress, and one with Wait gets the result.
func TestAcquireHeldAndWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = time.Second
		mem := idem.NewMemoryStore(nil)
		c := leaseConsumer(t, mem, lease)
		msg := idem.Message{ID: "m-1", Payload: []byte("p")}
		a, out, err := c.Acquire(t.Context(), msg, idem.AcquireOptions{})
		if a == nil {
			t.Fatalf("Acquire: %v %v", out, err)
		}
		time.Sleep(5 * lease)
		if _, out, err := c.Acquire(t.Context(), msg, idem.AcquireOptions{}); out.Status != idem.InProgress || !errors.Is(err, idem.ErrInProgress) {
			t.Fatalf("second Acquire: %v %v, want InProgress", out, err)
		}
		var waited atomic.Int32
		done := make(chan idem.Outcome)
		go func() {
			_, out, _ := c.Acquire(t.Context(), msg, idem.AcquireOptions{Wait: 10 * lease, OnWait: func() { waited.Add(1) }})
			done <- out
		}()
		time.Sleep(lease)
		if out, err := a.Complete(t.Context(), idem.Result{Body: []byte("r")}); err != nil || out.Status != idem.Processed {
			t.Fatalf("Complete: %v %v", out, err)
		}
		if out := <-done; out.Status != idem.Duplicate || string(out.Result) != "r" || waited.Load() != 1 {
			t.Fatalf("waiting Acquire: %v (waited %d), want Duplicate r", out, waited.Load())
		}
		if _, err := a.Complete(t.Context(), idem.Result{}); !errors.Is(err, idem.ErrAttemptEnded) {
			t.Fatalf("second Complete: %v, want ErrAttemptEnded", err)
		}
	})
}

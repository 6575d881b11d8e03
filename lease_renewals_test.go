package idem_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// countingStore counts the renewals that reach the memory store.
type countingStore struct {
	*idem.MemoryStore
	renews atomic.Int64
}

func (s *countingStore) Renew(ctx context.Context, p *idemdriver.RenewParams) error {
	s.renews.Add(1)
	return s.MemoryStore.Renew(ctx, p)
}

// Renewals cost no goroutine per message: holding 50 attempts adds no
// goroutine (the consumer's one timer schedules every renewal), and none
// is left when they end. Every attempt is renewed every Lease/3, on time:
// after three leases none has lost its lease, and each was renewed about
// 9 times. Not parallel: it counts the process's goroutines.
func TestRenewalsNoGoroutinePerMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease, n = 3 * time.Second, 50
		store := &countingStore{MemoryStore: idem.NewMemoryStore(nil)}
		c := leaseConsumer(t, store, lease)
		before := runtime.NumGoroutine()
		var held []*idem.Attempt
		for i := range n {
			a, out, err := c.Acquire(t.Context(), idem.Message{ID: fmt.Sprintf("m-%d", i), Payload: []byte("p")}, idem.AcquireOptions{})
			if a == nil {
				t.Fatalf("Acquire %d: %v %v", i, out, err)
			}
			held = append(held, a)
			time.Sleep(lease / 6 / n) // spread the renewal times, all after the last Acquire
		}
		synctest.Wait()
		if got := runtime.NumGoroutine() - before; got > 0 {
			t.Errorf("%d attempts held: %d more goroutines, want none", n, got)
		}
		time.Sleep(3 * lease)
		synctest.Wait()
		for i, a := range held {
			if err := a.Context().Err(); err != nil {
				t.Errorf("attempt %d: context ended (%v) although every renewal succeeds", i, context.Cause(a.Context()))
			}
			if left := time.Until(a.Deadline()); left < lease*2/3-time.Second {
				t.Errorf("attempt %d: %v of lease left, want at least %v (renewed every Lease/3)", i, left, lease*2/3-time.Second)
			}
		}
		if got, want := store.renews.Load(), int64(n*9); got < want-n || got > want+n {
			t.Errorf("%d renewals of %d attempts over 3 leases, want about %d", got, n, want)
		}
		for _, a := range held {
			if out, err := a.Complete(t.Context(), idem.Result{Body: []byte("ok")}); err != nil {
				t.Fatalf("Complete: %v %v", out, err)
			}
		}
		synctest.Wait()
		if got := runtime.NumGoroutine() - before; got > 0 {
			t.Errorf("after every attempt ended: %d more goroutines than before, want 0", got)
		}
		renews := store.renews.Load()
		time.Sleep(2 * lease)
		if got := store.renews.Load(); got != renews {
			t.Errorf("%d renewals after every attempt ended, want none", got-renews)
		}
	})
}

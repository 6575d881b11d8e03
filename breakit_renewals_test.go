package idem_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// stuckRenewStore stalls the renewals of the messages whose ID has the
// prefix stuck until their context ends (a renewal whose row another
// transaction holds locked, or whose connection stalled); the others take
// rtt (fake time), as a store across a network does, and fail, as such a
// store's do, when their context ends first.
type stuckRenewStore struct {
	*idem.MemoryStore
	stuck string
	rtt   time.Duration
}

func (s *stuckRenewStore) Renew(ctx context.Context, p *idemdriver.RenewParams) error {
	if strings.HasPrefix(p.MessageID, s.stuck) {
		<-ctx.Done()
		return ctx.Err()
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(s.rtt):
	}
	return s.MemoryStore.Renew(ctx, p)
}

// RenewsBatches is false: the scheduler sends its renewals one by one,
// through Renew above, not through the memory store's RenewBatch.
func (s *stuckRenewStore) RenewsBatches() bool { return false }

// TestBreakRenewalsFewStuck: a few held attempts whose renewals stall in
// the store must not cost the consumer's other attempts their leases,
// whose renewals the store answers in a round trip (5 ms). The stalled
// renewals come due first, then the others, 2 ms later. With fewer
// stalled renewals than the scheduler's goroutines (MaxRenewers) the
// others are renewed on time. With as many (16 records locked by an
// operator's open transaction are enough), the others queue until the
// stalled ones reach their own attempts' deadlines, 2 ms before their
// own: each is then sent with 2 ms of lease left, less than its round
// trip, and every one of them loses its lease locally (its context ends,
// its steps fail with ErrLeaseLost), although the store would have
// renewed it at once.
func TestBreakRenewalsFewStuck(t *testing.T) {
	for _, stuck := range []int{idem.MaxRenewers - 1, idem.MaxRenewers} {
		t.Run(fmt.Sprint(stuck), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const lease, n = 3 * time.Second, 100
				store := &stuckRenewStore{MemoryStore: idem.NewMemoryStore(nil), stuck: "stuck-", rtt: 5 * time.Millisecond}
				c := leaseConsumer(t, store, lease)
				acquire := func(id string) *idem.Attempt { return acquireID(t, c, id) }
				for i := range stuck {
					acquire(fmt.Sprintf("stuck-%d", i))
				}
				time.Sleep(2 * time.Millisecond)
				var healthy []*idem.Attempt
				for i := range n {
					healthy = append(healthy, acquire(fmt.Sprintf("ok-%d", i)))
				}
				time.Sleep(3 * lease)
				synctest.Wait()
				lost := countLost(healthy)
				if lost > 0 {
					t.Errorf("%d stalled renewals: %d of the %d other attempts lost their lease locally, whose renewals the store answers in %v", stuck, lost, len(healthy), store.rtt)
				}
				for _, a := range healthy {
					_, _ = a.Complete(t.Context(), idem.Result{})
				}
			})
		})
	}
}

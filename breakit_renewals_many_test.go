package idem_test

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
)

// renewers counts the goroutines of renewal schedulers (their workers,
// each in a renewal or about to take one).
func renewers() int {
	buf := make([]byte, 1<<24)
	n := 0
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, "idem.(*renewals).work") {
			n++
		}
	}
	return n
}

// acquireID acquires message id (payload "p") on c, failing the test
// when it is not acquired.
func acquireID(t *testing.T, c *idem.LeaseConsumer, id string) *idem.Attempt {
	t.Helper()
	a, out, err := c.Acquire(t.Context(), idem.Message{ID: id, Payload: []byte("p")}, idem.AcquireOptions{})
	if a == nil {
		t.Fatalf("Acquire %s: %v %v", id, out, err)
	}
	return a
}

// holdWatching lets steps*step pass (fake time), step by step, and
// returns the most renewal goroutines seen after each step (renewers).
func holdWatching(steps int, step time.Duration) (most int) {
	for range steps {
		time.Sleep(step)
		synctest.Wait()
		most = max(most, renewers())
	}
	return most
}

// countLost counts the attempts of as whose context ended.
func countLost(as []*idem.Attempt) (lost int) {
	for _, a := range as {
		if a.Context().Err() != nil {
			lost++
		}
	}
	return lost
}

// TestBreakRenewalsManyStuck: more stalled renewals than the scheduler's
// goroutines (MaxRenewers), coming due just before 600 others or
// interleaved with them: the attempts whose renewals the store answers in
// a round trip (5ms) must keep their leases for three leases running, the
// scheduler's goroutines stay within MaxRenewers plus one per held
// attempt, and once the healthy attempts complete, the stalled ones run
// out at their own deadlines and no renewal goroutine is left.
//
// Before renewals in flight for longer than a hundredth of the lease
// stopped counting while others waited, a stalled renewal stopped
// counting only at its own next tick (Lease/3), so each tick let 16 more
// stalled renewals from the head of the queue take the goroutines, and the
// healthy renewals queued behind them were sent at their deadline: with a
// Lease of 3s, 31 stalled first cost about 400 of 600 attempts their
// leases, 32 or more all 600; at the default Lease and StoreTimeout, 48
// stalled cost all 600 in 20 runs of 20.
func TestBreakRenewalsManyStuck(t *testing.T) {
	skipUnderRace(t)
	for _, tc := range []struct {
		lease  time.Duration
		order  string
		stuckN int
	}{
		{3 * time.Second, "stuck-first", 17}, {3 * time.Second, "stuck-first", 31},
		{3 * time.Second, "stuck-first", 32}, {3 * time.Second, "stuck-first", 300},
		{3 * time.Second, "interleaved", 300},
		// The defaults: Lease 30s, StoreTimeout 10s (a stalled renewal
		// gives up at its next tick).
		{idem.DefaultLease, "stuck-first", 24}, {idem.DefaultLease, "stuck-first", 48}, {idem.DefaultLease, "stuck-first", 300},
	} {
		order, stuckN, lease := tc.order, tc.stuckN, tc.lease
		t.Run(fmt.Sprintf("lease-%v/%s-%d", lease, order, stuckN), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				n := stressAttempts(600)
				stuck := stressAttempts(stuckN)
				store := &stuckRenewStore{MemoryStore: idem.NewMemoryStore(nil), stuck: "stuck-", rtt: 5 * time.Millisecond}
				c := leaseConsumer(t, store, lease)
				acquire := func(id string) *idem.Attempt { return acquireID(t, c, id) }
				var healthy, stalled []*idem.Attempt
				for i := range n {
					if order == "stuck-first" && i == 0 {
						for j := range stuck {
							stalled = append(stalled, acquire(fmt.Sprintf("stuck-%d", j)))
						}
						time.Sleep(2 * time.Millisecond)
					}
					if order == "interleaved" && i%2 == 0 {
						stalled = append(stalled, acquire(fmt.Sprintf("stuck-%d", i/2)))
						time.Sleep(time.Millisecond)
					}
					healthy = append(healthy, acquire(fmt.Sprintf("ok-%d", i)))
				}
				most := holdWatching(3*3, lease/3)
				lost := countLost(healthy)
				if lost > 0 {
					t.Errorf("%d stalled renewals (%s): %d of the %d other attempts lost their lease locally, whose renewals the store answers in %v", len(stalled), order, lost, len(healthy), store.rtt)
				}
				if bound := idem.MaxRenewers + len(stalled) + len(healthy); most > bound {
					t.Errorf("%d renewal goroutines at most; want at most %d (MaxRenewers + one per held attempt)", most, bound)
				}
				for _, a := range healthy {
					if _, err := a.Complete(t.Context(), idem.Result{}); err != nil {
						t.Fatalf("Complete %s: %v", a.Message.ID, err)
					}
				}
				time.Sleep(2 * lease)
				synctest.Wait()
				for _, a := range stalled {
					if a.Context().Err() == nil {
						t.Fatalf("stalled attempt %s still holds its lease two leases after its last renewal", a.Message.ID)
					}
				}
				if left := renewers(); left > 0 {
					t.Errorf("%d renewal goroutines left after every attempt ended or ran out", left)
				}
				t.Logf("%s: %d stalled, %d healthy (%d lost), at most %d goroutines", order, len(stalled), len(healthy), lost, most)
			})
		})
	}
}

package idempgxv5_test

import (
	"context"
	"sync"
	"testing"

	"github.com/idem-go/idem"
)

// TestBreakLockedAndLeasedRelays: a relay with locked rounds and one with
// leased rounds (a rolling change of RelayConfig.LockedRounds) run side
// by side on one outbox, each round in a loop until the outbox is empty,
// publishers healthy and leases long: every row is published exactly once
// (neither claims the rows the other holds, by lock or by lease), per key
// the first publications are in seq order, and the outbox ends empty.
func TestBreakLockedAndLeasedRelays(t *testing.T) {
	ctx := context.Background()
	b := setup(t, poolOpts{maxConns: 6})
	const keys, perKey = 8, 25
	rows := emitKeyed(t, b, keys, perKey)
	var (
		mu    sync.Mutex
		log   []idem.Outgoing
		count = map[string]int{}
		by    = map[bool]int{}
	)
	relay := func(locked bool) *idem.Relay {
		r, err := idem.NewRelay(idem.RelayConfig{Store: b.store, Workers: 1, BatchSize: 7, Retention: -1, LockedRounds: locked,
			Publisher: idem.PublisherFunc(func(_ context.Context, m []idem.Outgoing) []error {
				mu.Lock()
				defer mu.Unlock()
				log = append(log, m...)
				for _, o := range m {
					count[o.ID]++
				}
				by[locked] += len(m)
				return make([]error, len(m))
			})})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	var wg sync.WaitGroup
	for _, locked := range []bool{true, false} {
		r := relay(locked)
		wg.Go(func() {
			for idle := 0; idle < 3; {
				res, err := r.RunOnce(ctx)
				if err != nil {
					t.Errorf("locked %v: RunOnce: %v", locked, err)
					return
				}
				if res.Claimed == 0 {
					idle++
				}
			}
		})
	}
	wg.Wait()
	b.wantPendingRows(t, ctx, 0)
	mu.Lock()
	defer mu.Unlock()
	for _, row := range rows {
		if count[row.ID] != 1 {
			t.Errorf("%s published %d times, want once", row.ID, count[row.ID])
		}
	}
	firstsInKeyOrder(t, log)
	t.Logf("published by the locked relay %d, by the leased one %d", by[true], by[false])
}

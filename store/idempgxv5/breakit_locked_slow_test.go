package idempgxv5_test

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testenv"
)

// TestBreakLockedRoundPublishPastLease: a locked round (LockedRounds)
// whose publisher ignores its context and returns only after the
// server's idle_in_transaction_session_timeout (the relay's Lease) ended
// the round's session. The broker got the messages, but the round's
// delete and commit cannot land: RunOnce must report an error and no row
// sent, every row stays pending, and the next round sends them again (at
// least once: each of the killed round's messages exactly twice, the
// others once), the outbox ends empty, and per key the first
// publications stay in order; no pool connection is left acquired.
// Directly and through PgBouncer in
// transaction pooling (both exec modes that work there).
func TestBreakLockedRoundPublishPastLease(t *testing.T) {
	t.Run("direct", func(t *testing.T) { lockedRoundPastLease(t, poolOpts{maxConns: 4}) })
	for _, mode := range bouncerModes {
		t.Run(fmt.Sprintf("pgbouncer-%v", mode), func(t *testing.T) {
			lockedRoundPastLease(t, poolOpts{maxConns: 4, mode: mode, url: bouncerURL(t)})
		})
	}
}

func lockedRoundPastLease(t *testing.T, o poolOpts) {
	ctx := context.Background()
	b := setup(t, o)
	const keys, perKey, lease = 4, 3, 300 * time.Millisecond
	rows := emitKeyed(t, b, keys, perKey)

	var (
		mu      sync.Mutex
		log     []idem.Outgoing
		count   = map[string]int{}
		killed  []string
		stalled = true
	)
	r, err := idem.NewRelay(idem.RelayConfig{Store: b.store, Workers: 1, BatchSize: 10, Retention: -1, LockedRounds: true, Lease: lease,
		Publisher: idem.PublisherFunc(func(_ context.Context, m []idem.Outgoing) []error {
			mu.Lock()
			log = append(log, m...)
			for _, o := range m {
				count[o.ID]++
			}
			stall := stalled
			stalled = false
			if stall {
				for _, o := range m {
					killed = append(killed, o.ID)
				}
			}
			mu.Unlock()
			if stall {
				// Deaf to its context: returns once no session is
				// idle in a transaction on the outbox any more (the
				// server ended the round's).
				testenv.Eventually(t, 30*time.Second, "the round's session to end", func() bool {
					var n int
					err := b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
						WHERE datname = current_database() AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()
						AND query LIKE '%' || $1::text || '%'`, b.table+"_outbox").Scan(&n)
					return err == nil && n == 0
				}, nil)
			}
			return make([]error, len(m))
		})})
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.RunOnce(ctx)
	t.Logf("the round past its lease: %+v, %v", res, err)
	if err == nil || res.Sent != 0 {
		t.Errorf("RunOnce = %+v, %v; want an error and no row sent (the round's session ended before its delete)", res, err)
	}
	b.wantPendingRows(t, ctx, int64(len(rows)))
	for range 2 * perKey {
		if _, err := r.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	b.wantPendingRows(t, ctx, 0)
	if n := b.pool.Stat().AcquiredConns(); n != 0 {
		t.Errorf("%d pool connections still acquired after the rounds", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(killed) == 0 {
		t.Fatal("the first round published nothing")
	}
	want := map[string]int{}
	for _, row := range rows {
		want[row.ID] = 1
	}
	for _, id := range killed {
		want[id]++
	}
	if !maps.Equal(count, want) {
		t.Errorf("publications per row %v; want %v (the killed round's rows twice, the others once)", count, want)
	}
	firstsInKeyOrder(t, log)
}

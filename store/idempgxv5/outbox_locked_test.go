package idempgxv5_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/testenv"
)

// TestOutboxLockedRoundWritesOnce: a relay with the default rounds
// (idemdriver.OutboxLockedRounder: the claimed rows' locks held through
// the publish) writes each sent row once, its delete: no claim updates
// it. Every statement runs on the one connection of the pool, whose
// statistics are flushed before they are read.
func TestOutboxLockedRoundWritesOnce(t *testing.T) {
	const n = n2000
	st := relayProduced(t, n, false, func(m []idem.Outgoing) {
		for _, o := range m {
			if o.Attempts != 1 {
				t.Errorf("%s published at attempt %d, want 1", o.ID, o.Attempts)
			}
		}
	})
	if st.left != 0 || st.del != n || st.upd != 0 {
		t.Errorf("%d rows left, %d deleted, %d updated; want none left, %d deleted, none updated", st.left, st.del, st.upd, n)
	}
}

// tableWrites are the outbox table's statistics after relayProduced.
type tableWrites struct{ upd, hot, del, left int64 }

// relayProduced relays n rows a producer inserted (producedRows) with
// RunOnce until a round claims nothing, leased rounds or not, through a
// publisher that confirms every message (after passing it to check, if
// set), checks that each was published, and returns the table's
// statistics, flushed.
func relayProduced(t *testing.T, n int, leased bool, check func([]idem.Outgoing)) tableWrites {
	t.Helper()
	b, outbox := producedRows(t, n)
	ctx := context.Background()
	var published int
	r, err := idem.NewRelay(idem.RelayConfig{Store: b.store, Retention: -1, LockedRounds: !leased,
		Publisher: idem.PublisherFunc(func(_ context.Context, m []idem.Outgoing) []error {
			published += len(m)
			if check != nil {
				check(m)
			}
			return make([]error, len(m))
		})})
	if err != nil {
		t.Fatal(err)
	}
	for {
		res, err := r.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res.Claimed == 0 {
			break
		}
	}
	if published != n {
		t.Fatalf("published %d messages, want %d", published, n)
	}
	if _, err := b.pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		t.Fatal(err)
	}
	var st tableWrites
	if err := b.pool.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd, n_tup_del, (SELECT count(*) FROM `+outbox+`)
		FROM pg_stat_user_tables WHERE relid = $1::regclass`, outbox).Scan(&st.upd, &st.hot, &st.del, &st.left); err != nil {
		t.Fatal(err)
	}
	return st
}

// TestOutboxLockedRoundConnectionKilled: relay A's connection is killed
// (pg_terminate_backend) while it publishes a round, as a relay whose
// process or network died would lose it. Its rows' locks end with the
// session and nothing of its round is written: relay B sends every row,
// A's round's again (at least once), with no attempt counted for A's
// send; per key, first publications stay in seq order, and the outbox
// ends empty.
func TestOutboxLockedRoundConnectionKilled(t *testing.T) {
	ctx := context.Background()
	b := setup(t, poolOpts{maxConns: 4})
	const keys, perKey = 4, 5
	rows := emitKeyed(t, b, keys, perKey)

	var (
		mu    sync.Mutex
		log   []idem.Outgoing
		byA   []string
		pid   int32 // A's round's backend, terminated
		count = map[string]int{}
	)
	record := func(m []idem.Outgoing) {
		mu.Lock()
		defer mu.Unlock()
		log = append(log, m...)
		for _, o := range m {
			count[o.ID]++
		}
	}
	a, err := idem.NewRelay(idem.RelayConfig{Store: b.store, Workers: 1, BatchSize: 10, Retention: -1, LockedRounds: true,
		Publisher: idem.PublisherFunc(func(ctx context.Context, m []idem.Outgoing) []error {
			record(m)
			for _, o := range m {
				byA = append(byA, o.ID)
			}
			// The round's connection: the one idle in its transaction
			// after the claim of this test's table.
			var killed bool
			if err := b.pool.QueryRow(ctx, `SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity
				WHERE datname = current_database() AND state = 'idle in transaction' AND pid <> pg_backend_pid()
				AND query LIKE '%' || $1::text || '%'`, b.table+"_outbox").Scan(&pid, &killed); err != nil || !killed {
				t.Errorf("terminating the round's backend: %v, %v", killed, err)
			}
			return make([]error, len(m))
		})})
	if err != nil {
		t.Fatal(err)
	}
	res, err := a.RunOnce(ctx)
	if err == nil || res.Claimed != keys || res.Sent != 0 {
		t.Fatalf("A's RunOnce = %+v, %v; want %d rows claimed (one per key), an error, none ended", res, err, keys)
	}
	b.wantPendingRows(t, ctx, int64(len(rows)))
	// The backend ends, and its locks with it, shortly after the signal.
	testenv.Eventually(t, 30*time.Second, "A's round's backend to end", func() bool {
		var n int
		err := b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n)
		return err == nil && n == 0
	}, nil)

	bRelay, err := idem.NewRelay(idem.RelayConfig{Store: b.store, Workers: 1, BatchSize: 10, Retention: -1,
		Publisher: idem.PublisherFunc(func(_ context.Context, m []idem.Outgoing) []error {
			record(m)
			for _, o := range m {
				if o.Attempts != 1 {
					t.Errorf("%s sent by B at attempt %d, want 1 (A's killed round counted none)", o.ID, o.Attempts)
				}
			}
			return make([]error, len(m))
		})})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 * perKey {
		if _, err := bRelay.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	b.wantPendingRows(t, ctx, 0)
	mu.Lock()
	defer mu.Unlock()
	for _, r := range rows {
		want := 1
		for _, id := range byA {
			if id == r.ID {
				want = 2
			}
		}
		if count[r.ID] != want {
			t.Errorf("%s published %d times, want %d", r.ID, count[r.ID], want)
		}
	}
	firstsInKeyOrder(t, log)
}

// firstsInKeyOrder checks that, per key, the first publications of log
// (emitKeyed's rows, whose IDs sort in seq order within a key) are in
// seq order.
func firstsInKeyOrder(t *testing.T, log []idem.Outgoing) {
	t.Helper()
	last := map[string]string{}
	seen := map[string]bool{}
	for _, m := range log {
		if seen[m.ID] {
			continue
		}
		seen[m.ID] = true
		if prev := last[m.Key]; prev >= m.ID {
			t.Errorf("key %s: %s published first after %s", m.Key, m.ID, prev)
		}
		last[m.Key] = m.ID
	}
}

// n2000 is how many rows producedRows writes in the write-counting tests.
const n2000 = 2000

// producedRows sets up a store on a pool of one connection whose outbox
// holds n rows a producer inserted, each with a key of its own; it
// returns the bundle and the outbox table.
func producedRows(t *testing.T, n int) (*bundle, string) {
	t.Helper()
	testURL(t)
	b := setup(t, poolOpts{maxConns: 1})
	outbox := b.table + "_outbox"
	if _, err := b.pool.Exec(context.Background(), `INSERT INTO `+outbox+` (id, destination, order_key, payload)
		SELECT 'id-' || g, 'orders', 'order-' || g, '\x7b7d'::bytea FROM generate_series(1, $1::int) g`, n); err != nil {
		t.Fatal(err)
	}
	return b, outbox
}

// emitKeyed emits perKey rows for each of keys keys, in one committed
// transaction, interleaved by key ("k<key>-<i>"), and returns them.
func emitKeyed(t *testing.T, b *bundle, keys, perKey int) []idemdriver.OutgoingRecord {
	t.Helper()
	ctx := context.Background()
	tx, err := b.store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var rows []idemdriver.OutgoingRecord
	for i := range perKey {
		for k := range keys {
			id := fmt.Sprintf("k%d-%03d", k, i)
			rows = append(rows, idemdriver.OutgoingRecord{ID: id, Destination: "d", Key: fmt.Sprintf("k%d", k), Payload: []byte(id)})
		}
	}
	if err := b.store.EmitTx(ctx, tx, &idemdriver.EmitParams{Consumer: "c", Messages: rows}); err != nil {
		t.Fatal(err)
	}
	if err := b.store.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	return rows
}

// wantPendingRows checks the outbox's pending rows.
func (b *bundle) wantPendingRows(t *testing.T, ctx context.Context, want int64) {
	t.Helper()
	st, err := b.store.OutboxStats(ctx)
	if err != nil || st.Pending != want {
		t.Errorf("outbox: %+v, %v; want %d pending", st, err, want)
	}
}

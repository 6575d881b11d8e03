//go:build atsize

package idempgxv5_test

import (
	"context"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idempgxv5"
)

// TestOnlineUpgradeAtSize measures the upgrade to schema v2 (migrations
// 014 and 015: the consumer stored as a key) on a table of
// IDEM_UPGRADE_ATSIZE_ROWS records (10,000,000 unless set) while two
// consumers claim new messages: how long any session held a lock on the
// table that blocks its writers (SHARE or stronger: CREATE TRIGGER's,
// ALTER TABLE's ACCESS EXCLUSIVE; sampled every 5 ms in pg_locks, from the
// holding transaction's start), how long one waited for it, and the
// consumers' claim latencies before and during the upgrade. It asserts
// only that the upgrade ends and every record has its key; the figures
// are logged. Run it on a server of its own (it writes gigabytes of WAL):
//
//	IDEM_TEST_POSTGRES_URL=postgres://... go test -tags atsize -run TestOnlineUpgradeAtSize -v -timeout 90m ./store/idempgxv5/
func TestOnlineUpgradeAtSize(t *testing.T) {
	ctx := t.Context()
	rows := 10_000_000
	if s := os.Getenv("IDEM_UPGRADE_ATSIZE_ROWS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatal(err)
		}
		rows = n
	}
	const batch = 1000 // 014's
	u := upgradeTable(t, upgradeVariant{name: "default"}, consumerKeysVersion)
	direct, table, exec, store := u.direct, u.table, u.exec, u.store
	start := time.Now()
	const chunk = 1_000_000
	for lo := 1; lo <= rows; lo += chunk {
		exec(`INSERT INTO `+table+` (consumer, message_id, fingerprint, processed_at)
			SELECT CASE WHEN g % 3 = 0 THEN 'orders' ELSE 'payments-service-v2' END, 'v1-' || g, sha256(g::text::bytea), now() - ($2::int - g) * interval '1 millisecond'
			FROM generate_series($1::int, $2::int) g`, lo, min(lo+chunk-1, rows))
	}
	exec(`VACUUM ANALYZE ` + table)
	t.Logf("filled %d records in %v", rows, time.Since(start).Round(time.Second))

	var (
		mu       sync.Mutex
		phase    = "before"
		lat      = map[string][]time.Duration{}
		failures int
	)
	cctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for w := range 2 {
		c, err := idem.NewConsumer[pgx.Tx](store, idem.Config{Name: "payments-service-v2", PurgeInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = c.Close() }()
		noop := func(context.Context, pgx.Tx, idem.Message) error { return nil }
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; cctx.Err() == nil; i++ {
				id := "live-" + strconv.Itoa(w) + "-" + strconv.Itoa(i)
				t0 := time.Now()
				out, err := c.Process(cctx, idem.Message{ID: id, Payload: []byte(id)}, noop)
				d := time.Since(t0)
				mu.Lock()
				if err != nil || out.Status != idem.Processed {
					if cctx.Err() == nil {
						failures++
					}
				} else {
					lat[phase] = append(lat[phase], d)
				}
				mu.Unlock()
			}
		}()
	}
	// The sampler: the longest-held and the longest-awaited lock on the
	// table that blocks its writers (SHARE and stronger), by statement.
	var held, waited time.Duration
	var heldBy string
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for cctx.Err() == nil {
			var (
				granted bool
				age     time.Duration
				query   string
			)
			r, err := direct.Query(cctx, `SELECT l.granted, clock_timestamp() - COALESCE(l.waitstart, a.xact_start), a.query FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
				WHERE l.locktype = 'relation' AND l.relation = $1::regclass
				AND l.mode IN ('ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')`, table)
			if err == nil {
				_, err = pgx.ForEachRow(r, []any{&granted, &age, &query}, func() error {
					if granted && age > held {
						held, heldBy = age, query
					}
					if !granted && age > waited {
						waited = age
					}
					return nil
				})
			}
			if err != nil && cctx.Err() == nil {
				t.Errorf("sample pg_locks: %v", err)
				return
			}
			select {
			case <-cctx.Done():
			case <-tick.C:
			}
		}
	}()
	time.Sleep(10 * time.Second) // the baseline's claims (a measurement, not synchronisation)
	mu.Lock()
	phase = "during"
	mu.Unlock()
	start = time.Now()
	err := idempgxv5.MigrateWith(ctx, store, u.migs)
	took := time.Since(start)
	stop()
	wg.Wait()
	if err != nil {
		t.Fatalf("upgrade: %v", err)
	}
	var missing int64
	if err := direct.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE consumer_key IS NULL`).Scan(&missing); err != nil || missing != 0 {
		t.Errorf("records without a key: %d (%v)", missing, err)
	}
	if failures > 0 {
		t.Errorf("%d claims failed", failures)
	}
	t.Logf("upgrade of %d records took %v (batches of %d)", rows, took.Round(time.Second), batch)
	t.Logf("longest lock that blocks writers held: %v, by %q; longest wait for one: %v", held, heldBy, waited)
	for _, p := range []string{"before", "during"} {
		l := lat[p]
		if len(l) == 0 {
			continue
		}
		slices.Sort(l)
		t.Logf("claims %s the upgrade: %d, median %v, p99 %v, p99.9 %v, max %v", p, len(l), l[len(l)/2], l[len(l)*99/100], l[len(l)*999/1000], l[len(l)-1])
	}
}

package idempgxv5_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/sqlschema"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/jackc/pgx/v5"
)

// TestOutboxKeyHashUpgrade applies migration 011 to an outbox made by the
// migrations before it, holding more rows than sqlschema.SmallRows (so
// the index is built concurrently, outside the migration's transaction),
// in each layout and through PgBouncer: pending rows with ordering keys,
// rows failed for good and sent rows kept. Every row is as it was, the
// key index is the hash index (valid) and the old one is gone, a second
// Migrate changes nothing, and a relay then sends every pending row once,
// each key's rows in seq order, leaving the failed and kept rows alone.
func TestOutboxKeyHashUpgrade(t *testing.T) {
	runUpgrades(t, testOutboxKeyHashUpgrade)
}

func testOutboxKeyHashUpgrade(t *testing.T, v upgradeVariant) {
	ctx := t.Context()
	u := upgradeTable(t, v, 11)
	direct, table, exec, store := u.direct, u.table, u.exec, u.store
	outbox := table + "_outbox"
	const rows, keys = sqlschema.SmallRows + 500, 700
	// Every 50th row failed for good, every 50th (another) sent and kept;
	// every 10th without a key.
	exec(`INSERT INTO `+outbox+` (id, consumer, source_id, destination, order_key, payload)
		SELECT 'id-' || g, 'c', 'in-' || g, 'orders', CASE WHEN g % 10 = 0 THEN '' ELSE 'k-' || (g % $2::int) END, convert_to(g::text, 'UTF8')
		FROM generate_series(1, $1::int) g`, rows, keys)
	exec(`UPDATE ` + outbox + ` SET failed_at = now(), last_error = 'too large', attempts = 1 WHERE seq % 50 = 7`)
	exec(`UPDATE ` + outbox + ` SET sent_at = now(), attempts = 1 WHERE seq % 50 = 13`)
	snapshot := func() []string {
		t.Helper()
		rows, _ := direct.Query(ctx, `SELECT concat_ws('|', id, seq, consumer, source_id, destination, order_key, payload, headers, attempts,
			created_at, available_at, lease_until, last_error, sent_at, failed_at) FROM `+outbox+` ORDER BY seq`)
		s, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	indexes := func() map[string]bool {
		t.Helper()
		rows, _ := direct.Query(ctx, `SELECT c.relname::text, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = $1::regclass`, outbox)
		m := map[string]bool{}
		for rows.Next() {
			var name string
			var valid bool
			if err := rows.Scan(&name, &valid); err != nil {
				t.Fatal(err)
			}
			m[name[strings.LastIndex(name, "_outbox_")+1:]] = valid
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return m
	}
	before := snapshot()
	if ix := indexes(); !ix["outbox_key_pending"] || len(ix) != 5 {
		t.Fatalf("indexes before 011: %v, want the five of 010", ix)
	}
	for i := range 2 {
		if err := store.Migrate(ctx); err != nil {
			t.Fatalf("Migrate #%d: %v", i+1, err)
		}
	}
	if ix := indexes(); len(ix) != 5 || !ix["outbox_khash"] || !ix["outbox_pkey"] || !ix["outbox_pend"] || !ix["outbox_sent"] || !ix["outbox_failed"] {
		t.Errorf("indexes after 011: %v (name suffix: valid), want pkey, pend, khash, sent and failed, all valid", ix)
	}
	var recorded bool
	if err := direct.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+table+`_migrations WHERE version = 11)`).Scan(&recorded); err != nil || !recorded {
		t.Errorf("migration 11 recorded: %v, %v", recorded, err)
	}
	if after := snapshot(); !slices.Equal(after, before) {
		t.Fatalf("rows changed by 011 (%d rows before, %d after)", len(before), len(after))
	}

	// The relay sends every pending row once, in seq order per key.
	var (
		mu   sync.Mutex
		sent []idem.Outgoing
	)
	pub := idem.PublisherFunc(func(_ context.Context, m []idem.Outgoing) []error {
		mu.Lock()
		defer mu.Unlock()
		sent = append(sent, m...)
		return make([]error, len(m))
	})
	r, err := idem.NewRelay(idem.RelayConfig{Store: store, Publisher: pub, BatchSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for round := 0; ; round++ {
		res, err := r.RunOnce(ctx)
		if err != nil {
			t.Fatalf("RunOnce: %v", err)
		}
		if res.Claimed == 0 {
			break
		}
		if round > rows {
			t.Fatal("the relay does not finish")
		}
	}
	const done = 2 * rows / 50 // failed and kept, give or take one
	if n := len(sent); n < rows-done-2 || n > rows-done+2 {
		t.Errorf("sent %d rows, want the %d or so pending ones", n, rows-done)
	}
	seen := map[string]bool{}
	last := map[string]int64{}
	for _, m := range sent {
		if seen[m.ID] {
			t.Errorf("row %s sent twice", m.ID)
		}
		seen[m.ID] = true
		if m.Key == "" {
			continue
		}
		if m.Seq <= last[m.Key] {
			t.Errorf("key %s: row seq %d sent after seq %d", m.Key, m.Seq, last[m.Key])
		}
		last[m.Key] = m.Seq
	}
	var pending, failed, kept int
	if err := direct.QueryRow(ctx, `SELECT count(*) FILTER (WHERE sent_at IS NULL AND failed_at IS NULL), count(*) FILTER (WHERE failed_at IS NOT NULL),
		count(*) FILTER (WHERE sent_at IS NOT NULL) FROM `+outbox).Scan(&pending, &failed, &kept); err != nil {
		t.Fatal(err)
	}
	if pending != 0 || failed+kept+len(sent) != rows || failed == 0 || kept == 0 {
		t.Errorf("after the relay: %d pending, %d failed, %d kept, %d sent; want none pending and the failed and kept rows left of %d", pending, failed, kept, len(sent), rows)
	}
}

// TestMigrateOneConnection: Migrate on a pool of one connection creates
// the tables (migration 011 on an empty outbox runs in the migration's
// transaction), and on an outbox of SmallRows rows or more, whose index
// 011 would build concurrently beside the lock's transaction, it fails
// with idemdriver.ErrInvalidConfig instead of waiting for itself.
func TestMigrateOneConnection(t *testing.T) {
	testURL(t)
	t.Parallel()
	ctx := t.Context()
	pool := newPool(t, poolOpts{maxConns: 1})
	fresh := randName("idem_one_")
	t.Cleanup(func() { _ = dropTables(context.Background(), newPool(t, poolOpts{}), fresh) })
	s, err := idempgxv5.New(pool, &idempgxv5.Config{Table: fresh})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate of a new table on one connection: %v", err)
	}

	u := upgradeTable(t, upgradeVariant{name: "default"}, 11)
	u.exec(`INSERT INTO ` + u.table + `_outbox (id, destination, payload) SELECT 'id-' || g, 'd', '\x00' FROM generate_series(1, ` + strconv.Itoa(sqlschema.SmallRows) + `) g`)
	one, err := idempgxv5.New(pool, &idempgxv5.Config{Table: u.table})
	if err != nil {
		t.Fatal(err)
	}
	if err := one.Migrate(ctx); !errors.Is(err, idemdriver.ErrInvalidConfig) {
		t.Errorf("Migrate of a large outbox on one connection: %v, want ErrInvalidConfig", err)
	}
	if err := u.store.Migrate(ctx); err != nil {
		t.Errorf("Migrate on a pool of more: %v", err)
	}
}

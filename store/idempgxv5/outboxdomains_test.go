package idempgxv5_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestOutboxDomainsUpgrade applies migration 010 to an outbox made by the
// migrations before it, holding rows, in each layout (and through
// PgBouncer): the five byte-length checks leave the table for the domains
// <table>_outbox_id and <table>_outbox_str, without rewriting the table or
// rebuilding an index but the partial key index, the rows are as they
// were, the bounds still hold for any writer (SQLSTATE 23514), a second
// Migrate changes nothing, and the relay's claim and mark work on the
// rows from before. It fails without the migration (5 checks left).
func TestOutboxDomainsUpgrade(t *testing.T) {
	runUpgrades(t, testOutboxDomainsUpgrade)
}

func testOutboxDomainsUpgrade(t *testing.T, v upgradeVariant) {
	ctx := t.Context()
	u := upgradeTable(t, v, 10)
	direct, table, exec, store := u.direct, u.table, u.exec, u.store
	outbox := table + "_outbox"
	cols := []string{"id", "consumer", "source_id", "destination", "order_key"}
	checks := func() int {
		t.Helper()
		var n int
		if err := direct.QueryRow(ctx, `SELECT count(*) FROM pg_constraint c
			JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
			WHERE c.conrelid = $1::regclass AND c.contype = 'c' AND a.attname = ANY($2::text[])`, outbox, cols).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// files lists the table's and its indexes' files, by name.
	files := func() map[string]uint32 {
		t.Helper()
		rows, _ := direct.Query(ctx, `SELECT c.relname::text, c.relfilenode::int8 FROM pg_class c
			WHERE c.oid = $1::regclass OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = $1::regclass)`, outbox)
		m := map[string]uint32{}
		for rows.Next() {
			var name string
			var node int64
			if err := rows.Scan(&name, &node); err != nil {
				t.Fatal(err)
			}
			m[name] = uint32(node)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return m
	}
	snapshot := func() []string {
		t.Helper()
		rows, _ := direct.Query(ctx, `SELECT concat_ws('|', id, seq, consumer, source_id, destination, order_key, payload, headers, attempts, created_at)
			FROM `+outbox+` ORDER BY seq`)
		s, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if n := checks(); n != 5 {
		t.Fatalf("before 010: %d checks on the five columns, want 5", n)
	}
	exec(`INSERT INTO ` + outbox + ` (id, consumer, source_id, destination, order_key, payload)
		SELECT 'id-' || g, 'c', 'in-' || g, 'orders', CASE WHEN g % 2 = 0 THEN 'k-' || g ELSE '' END, '\x7b7d'::bytea FROM generate_series(1, 1000) g`)
	filesBefore, before := files(), snapshot()

	for i := range 2 {
		if err := store.Migrate(ctx); err != nil {
			t.Fatalf("Migrate #%d: %v", i+1, err)
		}
		if n := checks(); n != 0 {
			t.Fatalf("after Migrate #%d: %d checks left on the five columns, want none", i+1, n)
		}
	}
	if after := files(); len(after) != len(filesBefore) || len(after) < 5 {
		t.Errorf("relations after 010 %v, want the table and its indexes as before: %v", after, filesBefore)
	} else {
		// PostgreSQL rebuilds a partial index on a column whose type
		// changes, whatever the type: the key index, which holds only
		// pending rows (migration 007 built it the same way). Migration
		// 013 replaces the failed rows' index (_outbox_fail) by another.
		for name, node := range filesBefore {
			if rebuilt := after[name] != node; rebuilt != (strings.HasSuffix(name, "_outbox_key_pending") || strings.HasSuffix(name, "_outbox_fail")) {
				t.Errorf("%s: file %d before 010, %d after (rebuilt: %v)", name, node, after[name], rebuilt)
			}
		}
	}
	if after := snapshot(); strings.Join(after, "\n") != strings.Join(before, "\n") {
		t.Errorf("rows changed by 010 (%d rows before, %d after)", len(before), len(after))
	}
	rows, _ := direct.Query(ctx, `SELECT format_type(atttypid, NULL) || ' ' || COALESCE((SELECT collname FROM pg_collation WHERE oid = attcollation), '') FROM pg_attribute
		WHERE attrelid = $1::regclass AND attname = ANY($2::text[]) ORDER BY attnum`, outbox, cols)
	types, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for i, typ := range types {
		if !strings.Contains(typ, "_outbox_") || !strings.HasSuffix(typ, " C") {
			t.Errorf("column %d is of type %q, want one of the outbox's domains, collation C", i, typ)
		}
	}

	// The bounds, for any writer.
	long := strings.Repeat("x", 256)
	for _, bad := range []struct{ what, id, consumer, source, dest, key string }{
		{"empty id", "", "", "", "d", ""},
		{"256-byte id", long, "", "", "d", ""},
		{"empty destination", "x", "", "", "", ""},
		{"256-byte destination", "x", "", "", long, ""},
		{"256-byte consumer", "x", long, "", "d", ""},
		{"256-byte source_id", "x", "", long, "d", ""},
		{"256-byte order_key", "x", "", "", "d", long},
	} {
		_, err := direct.Exec(ctx, `INSERT INTO `+outbox+` (id, consumer, source_id, destination, order_key, payload) VALUES ($1, $2, $3, $4, $5, '\x00')`,
			bad.id, bad.consumer, bad.source, bad.dest, bad.key)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "23514" {
			t.Errorf("insert with %s: %v, want SQLSTATE 23514 (check_violation)", bad.what, err)
		}
	}
	exec(`INSERT INTO `+outbox+` (id, consumer, source_id, destination, order_key, payload) VALUES ($1::text, $1::text, $1::text, $1::text, $1::text, '\x00')`, strings.Repeat("y", 255))

	// The relay's statements on the rows from before.
	claimed, err := store.ClaimOutgoing(ctx, &idemdriver.ClaimOutgoingParams{Limit: 2000, Lease: time.Hour})
	if err != nil || len(claimed) != 1001 {
		t.Fatalf("claim after 010: %d rows, %v; want 1001", len(claimed), err)
	}
	ids := make([]string, len(claimed))
	for i, r := range claimed {
		ids[i] = r.ID
	}
	if err := store.MarkSent(ctx, &idemdriver.MarkSentParams{IDs: ids}); err != nil {
		t.Fatal(err)
	}
	if st, err := store.OutboxStats(ctx); err != nil || st.Pending != 0 {
		t.Fatalf("after marking every row sent: %+v, %v; want none pending", st, err)
	}
}

// TestMigrateAgainOverLeftOutbox: the processed table and the record of
// applied migrations dropped by hand, the outbox and its domains left
// behind (what a reset that drops only those two leaves), Migrate runs
// every migration again and completes: migration 010 adds the domains'
// checks only where they are missing. Before, it failed with SQLSTATE
// 42710 (constraint already exists for the domain).
func TestMigrateAgainOverLeftOutbox(t *testing.T) {
	ctx := t.Context()
	b := setup(t, poolOpts{})
	if _, err := b.pool.Exec(ctx, `DROP TABLE `+b.table+`, `+b.table+`_migrations`); err != nil {
		t.Fatal(err)
	}
	if err := b.store.Migrate(ctx); err != nil {
		t.Fatalf("Migrate over the outbox left behind: %v", err)
	}
	var checks int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_constraint WHERE contypid IN ($1::regtype, $2::regtype)`,
		b.table+"_outbox_id", b.table+"_outbox_str").Scan(&checks); err != nil {
		t.Fatal(err)
	}
	if checks != 2 {
		t.Errorf("%d checks on the outbox's domains; want 2 (one each)", checks)
	}
}

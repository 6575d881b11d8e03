package idempgxv5_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestEmitServerInstructions counts a PostgreSQL backend's user-space
// instructions per transaction that emits one outgoing message, as
// idem's consumer sends it (Store.Begin, then Store.EmitCommit: the
// outbox INSERT and the COMMIT pipelined), against the hand-written
// outbox's INSERT (checkedOutbox, the benchmarks' best_checked_outbox1)
// sent the same way, an empty transaction, and idem's INSERT sent by hand
// on outbox tables changed one part at a time (the trigger, the quiet
// condition, the indexes, the domains, the headers), which says what each
// part costs. Each transaction is BEGIN in one round trip, then the
// INSERT and COMMIT in a second. It needs the PostgreSQL under callgrind
// of TestClaimServerInstructions (same variables) and skips without one.
//
// Every case has a table of its own, into which 10,000 rows were
// inserted and every other one deleted, vacuumed and analyzed. Each case
// runs twice, each time on a new connection: 21 and 221 transactions;
// the difference of the two backends' totals over the 200 transactions
// in between is the cost of one. IDEM_CALLGRIND_CASES, if set, runs only
// the cases whose names contain one of its comma-separated parts.
func TestEmitServerInstructions(t *testing.T) {
	url, dir := os.Getenv("IDEM_CALLGRIND_POSTGRES"), os.Getenv("IDEM_CALLGRIND_DIR")
	if url == "" || dir == "" {
		t.Skip("set IDEM_CALLGRIND_POSTGRES and IDEM_CALLGRIND_DIR (see TestClaimServerInstructions)")
	}
	ctx := context.Background()
	pool := newPool(t, poolOpts{maxConns: 2, url: url})
	payload := []byte(`{"order":"o-1","amount":200}`)
	// An outbox table of idem's per case, migrated, filled and changed by
	// alter (statements with %[1]s for the outbox table, %[2]s for its
	// bare name).
	idemTable := func(alter ...string) string {
		b := setupOn(t, pool)
		ob := b.table + "_outbox"
		stmts := []string{`INSERT INTO ` + ob + ` (id, consumer, source_id, destination, order_key, payload)
			SELECT 'seed-' || g, 'bench', 's-' || g, 'orders.charged', 's-' || g, '\x00'::bytea FROM generate_series(1, 10000) g`,
			`DELETE FROM ` + ob + ` WHERE seq % 2 = 0`}
		for _, q := range alter {
			stmts = append(stmts, fmt.Sprintf(q, ob, b.table))
		}
		stmts = append(stmts, `VACUUM ANALYZE `+ob)
		for _, q := range stmts {
			if _, err := pool.Exec(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		return b.table
	}
	checked := newCheckedOutbox(randName("idem_cob_"))
	t.Cleanup(func() { _ = dropTables(context.Background(), pool, checked.table) })
	if err := checked.create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO ` + checked.table + ` (id, destination, order_key, payload) SELECT 'seed-' || g, 'orders.charged', 's-' || g, '\x00'::bytea FROM generate_series(1, 10000) g`,
		`DELETE FROM ` + checked.table + ` WHERE seq % 2 = 0`,
		`VACUUM ANALYZE ` + checked.table,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}

	quiet := `set_config('idem.outbox_quiet', 'on', true) = 'on'`
	cols := ` (id, consumer, source_id, destination, order_key, payload)`
	params := `($1::text, $2::text, $3::text, $4::text, $5::text, $6::bytea)`
	idemSQL := func(ob string) string {
		return `INSERT INTO ` + ob + cols + ` SELECT * FROM (VALUES ` + params + `) AS v WHERE ` + quiet + ` ON CONFLICT (id) DO NOTHING`
	}
	idemArgs := func(pool *pgxpool.Pool, i int) []any {
		src := fmt.Sprintf("m-%p-%d", pool, i)
		return []any{idem.OutgoingID("bench", src, "", 1), "bench", src, "orders.charged", src, payload}
	}
	type kase struct {
		name string
		// table returns the processed-messages table of the case's store
		// (its outbox is table + "_outbox"), or "" for the hand-written one.
		table func() string
		// sql returns the statement for outbox table ob ("" for an empty
		// transaction), args its arguments.
		sql  func(ob string) string
		args func(pool *pgxpool.Pool, i int) []any
		// store: sent through idem's Store (Begin, EmitCommit) instead.
		store bool
	}
	byHand := func(name string, sql func(string) string, alter ...string) kase {
		return kase{name: name, table: func() string { return idemTable(alter...) }, sql: sql, args: idemArgs}
	}
	sqlOf := func(s string) func(string) string {
		return func(ob string) string { return fmt.Sprintf(s, ob) }
	}
	when := `DROP TRIGGER %[2]s_outbox_notify ON %[1]s`
	whenCreate := `CREATE TRIGGER %[2]s_outbox_notify AFTER INSERT ON %[1]s FOR EACH STATEMENT WHEN (current_setting('idem.outbox_quiet', true) IS DISTINCT FROM 'on') EXECUTE FUNCTION %[1]s_notify()`
	plainValues := `INSERT INTO %s` + cols + ` VALUES ` + params + ` ON CONFLICT (id) DO NOTHING`
	noDomains := `ALTER TABLE %[1]s ALTER COLUMN id TYPE text COLLATE "C", ALTER COLUMN destination TYPE text COLLATE "C", ALTER COLUMN consumer TYPE text COLLATE "C", ALTER COLUMN source_id TYPE text COLLATE "C", ALTER COLUMN order_key TYPE text COLLATE "C"`
	withHeaders := func(h string) string {
		return `INSERT INTO %s (id, consumer, source_id, destination, order_key, payload, headers) SELECT * FROM (VALUES ($1::text, $2::text, $3::text, $4::text, $5::text, $6::bytea, ` + h + `)) AS v WHERE ` + quiet + ` ON CONFLICT (id) DO NOTHING`
	}
	cases := []kase{
		{name: "empty transaction", table: func() string { return "" }, sql: func(string) string { return "" }},
		{name: "hand-written INSERT (22-byte ID)", table: func() string { return "" },
			sql: func(string) string { return checked.emitSQL },
			args: func(pool *pgxpool.Pool, i int) []any {
				src := fmt.Sprintf("m-%p-%d", pool, i)
				return []any{checkedID("bench", src, false), "orders.charged", src, payload}
			}},
		{name: "hand-written INSERT (idem's 69-byte ID)", table: func() string { return "" },
			sql: func(string) string { return checked.emitSQL },
			args: func(pool *pgxpool.Pool, i int) []any {
				src := fmt.Sprintf("m-%p-%d", pool, i)
				return []any{checkedID("bench", src, true), "orders.charged", src, payload}
			}},
		{name: "idem (Begin, EmitCommit)", table: func() string { return idemTable() }, store: true},
		byHand("by hand: idem's statement (no headers)", idemSQL),
		byHand("trigger WHEN quiet", idemSQL, when, whenCreate),
		byHand("no trigger", idemSQL, `DROP TRIGGER %[2]s_outbox_notify ON %[1]s`),
		byHand("no trigger, VALUES (no set_config)", sqlOf(plainValues), `DROP TRIGGER %[2]s_outbox_notify ON %[1]s`),
		byHand("no trigger, VALUES, no ON CONFLICT", sqlOf(`INSERT INTO %s`+cols+` VALUES `+params), `DROP TRIGGER %[2]s_outbox_notify ON %[1]s`),
		byHand("no sent/failed indexes", idemSQL, `DROP INDEX %[2]s_outbox_sent`, `DROP INDEX %[2]s_outbox_failed`),
		byHand("no key-hash index", idemSQL, `DROP INDEX %[2]s_outbox_khash`),
		{name: "headers given ('{}')", table: func() string { return idemTable() },
			sql:  sqlOf(withHeaders(`$7::jsonb`)),
			args: func(pool *pgxpool.Pool, i int) []any { return append(idemArgs(pool, i), "{}") }},
		{name: "headers given (NULL, COALESCE to '{}')", table: func() string { return idemTable() },
			sql:  sqlOf(withHeaders(`COALESCE($7::jsonb, '{}')`)),
			args: func(pool *pgxpool.Pool, i int) []any { return append(idemArgs(pool, i), nil) }},
		{name: "consumer, source_id by default", table: func() string { return idemTable() },
			sql: sqlOf(`INSERT INTO %s (id, destination, order_key, payload) SELECT * FROM (VALUES ($1::text, $2::text, $3::text, $4::bytea)) AS v WHERE ` + quiet + ` ON CONFLICT (id) DO NOTHING`),
			args: func(pool *pgxpool.Pool, i int) []any {
				a := idemArgs(pool, i)
				return []any{a[0], a[3], a[4], a[5]}
			}},
		byHand("none of: trigger, set_config, domains, sent/failed indexes", sqlOf(plainValues), `DROP TRIGGER %[2]s_outbox_notify ON %[1]s`,
			`DROP INDEX %[2]s_outbox_sent`, `DROP INDEX %[2]s_outbox_failed`, noDomains),
		byHand("trigger for each row", idemSQL, `DROP TRIGGER %[2]s_outbox_notify ON %[1]s`,
			`CREATE TRIGGER %[2]s_outbox_notify AFTER INSERT ON %[1]s FOR EACH ROW EXECUTE FUNCTION %[1]s_notify()`),
		byHand("ON CONFLICT without arbiter", func(ob string) string { return strings.Replace(idemSQL(ob), "(id) DO", "DO", 1) }),
		byHand("VALUES, set_config in the payload", sqlOf(`INSERT INTO %s`+cols+` VALUES ($1::text, $2::text, $3::text, $4::text, $5::text, CASE WHEN `+quiet+` THEN $6::bytea END) ON CONFLICT (id) DO NOTHING`)),
		byHand("VALUES, set_config as a one-time filter", sqlOf(`INSERT INTO %s`+cols+` SELECT * FROM (VALUES `+params+`) AS v WHERE (SELECT `+quiet+`) ON CONFLICT (id) DO NOTHING`)),
		byHand("text columns, no domains", idemSQL, noDomains),
		byHand("created_at, available_at without default", idemSQL,
			`ALTER TABLE %[1]s ALTER COLUMN created_at DROP NOT NULL, ALTER COLUMN created_at DROP DEFAULT, ALTER COLUMN available_at DROP NOT NULL, ALTER COLUMN available_at DROP DEFAULT`),
	}
	if only := os.Getenv("IDEM_CALLGRIND_CASES"); only != "" {
		cases = filterCases(cases, only, func(c kase) string { return c.name })
	}
	for _, c := range cases {
		table := c.table()
		ob := checked.table
		if table != "" {
			ob = table + "_outbox"
		}
		q := c.sql
		if q == nil {
			q = idemSQL
		}
		stmt := q(ob)
		op := func(pool *pgxpool.Pool, st *idempgxv5.Store, i int) error {
			if c.store {
				tx, err := st.Begin(ctx)
				if err != nil {
					return err
				}
				src := fmt.Sprintf("m-%p-%d", pool, i)
				return st.EmitCommit(ctx, tx, &idemdriver.EmitParams{Consumer: "bench", RelayWoken: true, Messages: []idemdriver.OutgoingRecord{{
					ID: idem.OutgoingID("bench", src, "", 1), Consumer: "bench", SourceID: src,
					Destination: "orders.charged", Key: src, Payload: payload}}})
			}
			var args []any
			if c.args != nil {
				args = c.args(pool, i)
			}
			return emitByHand(ctx, pool, stmt, args)
		}
		storeTable := table
		if storeTable == "" {
			storeTable = randName("idem_t_") // never migrated: the store is unused
		}
		counts, pids := make([]float64, 2), make([]string, 2)
		for k, n := range []int{21, 221} {
			pid := callgrindBackend(t, url, storeTable, n, func(pool *pgxpool.Pool, st *idempgxv5.Store, i int) error {
				if err := op(pool, st, i); err != nil {
					return fmt.Errorf("%s: %w", c.name, err)
				}
				return nil
			})
			counts[k], pids[k] = exitInstructions(t, dir, pid), pid
		}
		t.Logf("%-44s %6.1fk instructions per transaction (backends %s)", c.name, (counts[1]-counts[0])/200/1000, strings.Join(pids, ", "))
	}
}

// emitByHand sends BEGIN in one round trip, then q (if not empty) with
// args and COMMIT pipelined, on a connection of pool.
func emitByHand(ctx context.Context, pool *pgxpool.Pool, q string, args []any) error {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	if _, err := c.Exec(ctx, `BEGIN`); err != nil {
		return err
	}
	b := &pgx.Batch{}
	if q != "" {
		b.Queue(q, args...)
	}
	b.Queue(`COMMIT`)
	return c.SendBatch(ctx, b).Close()
}

// filterCases keeps the cases whose name contains one of the
// comma-separated parts of only.
func filterCases[T any](cases []T, only string, name func(T) string) []T {
	var kept []T
	for _, c := range cases {
		for _, part := range strings.Split(only, ",") {
			if part != "" && strings.Contains(name(c), part) {
				kept = append(kept, c)
				break
			}
		}
	}
	return kept
}

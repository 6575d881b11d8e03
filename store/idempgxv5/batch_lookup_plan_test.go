package idempgxv5_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A table without column statistics (new, restored, upgraded with
// pg_upgrade, or a new bucket's partition, until autovacuum analyzes it:
// up to autovacuum_naptime, a minute by default, after its first rows)
// makes PostgreSQL take consumer = $1 to match 0.5% of the rows, where it
// matches all of them on a table of one consumer. The batch claim's lookup
// of recorded messages must still probe the primary key by message ID: a
// plan that scans by consumer alone and filters the IDs reads every record
// of the consumer per batch, so claims slow down with the table's size
// until the next analyze (measured on a new bucket's partition: 125 ms per
// batch of 100 at 65,000 records). Checked on both layouts, on the custom
// and the generic plan, with autovacuum off so that no analyze happens
// meanwhile.
func TestBatchLookupWithoutStatisticsProbesByMessageID(t *testing.T) {
	testURL(t)
	ids := make([]string, 100)
	fps := make([][]byte, 100)
	msgs := make([]idemdriver.ClaimMessage, 100)
	for i := range ids {
		ids[i], fps[i] = fmt.Sprintf("new-%d", i), []byte{1}
		msgs[i] = idemdriver.ClaimMessage{MessageID: ids[i], Fingerprint: fps[i]}
	}
	for _, layout := range []struct {
		name string
		part *idempgxv5.Partitions
	}{{"default", nil}, {"partitioned", &idempgxv5.Partitions{Bucket: time.Hour}}} {
		t.Run(layout.name, func(t *testing.T) {
			b := setup(t, poolOpts{part: layout.part})
			var (
				query string
				args  []any
			)
			if layout.part == nil {
				query, args = idempgxv5.ClaimBatchQuery(b.store, &idemdriver.ClaimBatchParams{Consumer: "c", Messages: msgs})
			} else {
				query, args = idempgxv5.PartitionedClaimBatchSQL(b.store), []any{"c", ids, fps}
			}
			lookupPlans(t, b, query, args)
		})
	}
}

// lookupPlans fills b's table (its partitions, if any) with 20,000
// records of consumer "c" with autovacuum off (fillConsumer), and checks
// the custom and the generic plan of query with probePlans.
func lookupPlans(t *testing.T, b *bundle, query string, args []any) {
	t.Helper()
	conn := fillConsumer(t, b)
	probePlans(t, b, conn, query, args)
}

// fillConsumer turns autovacuum off on b's table (its partitions, if
// any), so that no analyze happens during the test, and adds 20,000
// records of consumer "c" ("old-1" to "old-20000"). It returns the
// connection to plan on, released at the end of the test.
func fillConsumer(t *testing.T, b *bundle) *pgxpool.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Release)
	// The tables that hold rows: the partitions, or the table itself.
	rows, err := conn.Query(ctx, `SELECT oid::regclass::text FROM pg_class WHERE relkind = 'r'
		AND (oid = $1::regclass OR oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = $1::regclass))`, b.table)
	if err != nil {
		t.Fatal(err)
	}
	leaves, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(leaves) == 0 {
		t.Fatalf("leaves of %s %v: %v", b.table, leaves, err)
	}
	for _, tb := range leaves {
		if _, err := conn.Exec(ctx, `ALTER TABLE `+tb+` SET (autovacuum_enabled = off)`); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conn.Exec(ctx, recordsInsert(b.table, b.part == nil, "'c'", "message_id, fingerprint")+
		`'old-' || g, '\x00'::bytea FROM generate_series(1, 20000) g`); err != nil {
		t.Fatal(err)
	}
	return conn
}

// probePlans checks the custom and the generic plan of query (with
// parameters args) on conn, or its plans in the given plan_cache_modes: every scan of b's table (or of its
// partitions) probes its key by message ID, or walks the retention index
// by age (a purge's batch); a scan by consumer alone reads every record
// of the consumer.
func probePlans(t *testing.T, b *bundle, conn *pgxpool.Conn, query string, args []any, modes ...string) {
	t.Helper()
	ctx := context.Background()
	// EXPLAIN of the statement itself would plan it for the values of
	// args, as a custom plan, whatever plan_cache_mode says: a generic
	// plan comes only from a prepared statement.
	if _, err := conn.Exec(ctx, `PREPARE probed AS `+query); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if _, err := conn.Exec(ctx, `DEALLOCATE probed`); err != nil {
			t.Fatal(err)
		}
	}()
	params := make([]string, len(args))
	for i := range params {
		params[i] = "$" + strconv.Itoa(i+1)
	}
	explain := `EXPLAIN (FORMAT JSON) EXECUTE probed(` + strings.Join(params, ", ") + `)`
	if len(modes) == 0 {
		modes = []string{"force_custom_plan", "force_generic_plan"}
	}
	for _, mode := range modes {
		if _, err := conn.Exec(ctx, `SET plan_cache_mode = `+mode); err != nil {
			t.Fatal(err)
		}
		var raw []byte
		// EXECUTE takes no parameters of its own: the simple protocol
		// writes args into the text as literals.
		if err := conn.QueryRow(ctx, explain, append([]any{pgx.QueryExecModeSimpleProtocol}, args...)...).Scan(&raw); err != nil {
			t.Fatal(err)
		}
		plan := parsePlan(t, raw)
		probes := 0
		plan.walk(func(n *planNode) {
			if !strings.HasPrefix(n.RelationName, b.table) && !strings.HasPrefix(n.IndexName, b.table) {
				return
			}
			switch {
			case n.RelationName == b.table+"_consumers" && strings.HasPrefix(n.IndexCond, "(name = "):
				// The consumer's key found by name (schema v2, the
				// operator's statements): one probe of the consumers
				// table's unique index on name.
			case strings.Contains(n.IndexCond, "message_id"):
				probes++
			case strings.Contains(n.IndexCond, "processed_at <"):
			case n.NodeType == "ModifyTable":
			case n.IndexName != "" || n.NodeType == "Seq Scan" || n.NodeType == "Bitmap Heap Scan":
				t.Errorf("%s: a %s of %s%s with index condition %q, not by message ID", mode, n.NodeType, n.RelationName, n.IndexName, n.IndexCond)
			}
		})
		if probes == 0 {
			t.Errorf("%s: no probe by message ID: %s", mode, raw)
		}
	}
	if _, err := conn.Exec(ctx, `RESET plan_cache_mode`); err != nil {
		t.Fatal(err)
	}
}

// A consumer that is rare or absent in the table's statistics (new on a
// table that holds another consumer's records, until autovacuum analyzes
// the table again, after a tenth of its rows changed) makes PostgreSQL
// take consumer = 'c' to match a row or two, and a scan of the retention
// index (consumer, processed_at) by consumer alone then looks as cheap as
// a probe of the primary key, while it reads every record of the consumer
// (measured with 200,000 of them: 25 to 55 ms per redelivery's claim,
// 3.6 s per batch of 100). The purge's delete of recovery points joined
// each of the consumer's steps against the whole batch (84 s per batch at
// 200,000 steps). Every statement of the default layout that finds
// records or recovery points by key must probe a primary key by message
// ID, on the custom plan (the first executions of a prepared statement, and every
// one behind PgBouncer without prepared statements) and the generic one.
func TestKeyedStatementsOfAConsumerRareInStatisticsProbeByMessageID(t *testing.T) {
	testURL(t)
	b := setup(t, poolOpts{})
	ctx := context.Background()
	steps := b.table + "_steps"
	for _, q := range []string{
		recordsInsert(b.table, true, "'other'", "message_id, fingerprint") +
			`'h-' || g, '\x00'::bytea FROM generate_series(1, 20000) g`,
		`INSERT INTO ` + steps + ` (consumer, message_id, step, result)
			SELECT 'other', 'h-' || g, 'charge', '\x00'::bytea FROM generate_series(1, 20000) g`,
		`ANALYZE ` + b.table + `, ` + steps,
		`ALTER TABLE ` + steps + ` SET (autovacuum_enabled = off)`,
	} {
		if _, err := b.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	conn := fillConsumer(t, b)
	// A recovery point for each of the consumer's records, which the
	// purge deletes with them.
	if _, err := conn.Exec(ctx, `INSERT INTO `+steps+` (consumer, message_id, step, result)
		SELECT 'c', 'old-' || g, 'charge', '\x00'::bytea FROM generate_series(1, 20000) g`); err != nil {
		t.Fatal(err)
	}
	var key int32
	if err := conn.QueryRow(ctx, `SELECT key FROM `+b.table+`_consumers WHERE name = 'c'`).Scan(&key); err != nil {
		t.Fatal(err)
	}
	ids, hexFps, fps := []string{"old-1", "old-2", "new-1"}, []string{"00", "00", "01"}, [][]byte{{0}, {0}, {1}}
	// Schema v2: the per-message statements take the consumer's key; those
	// that write a recovery point take its name too, last; the purge's
	// batch takes the key, then the name; Inspect takes the name.
	args := map[string][]any{
		"fingerprint":      {key, "old-1"},
		"record":           {key, "old-1"},
		"claimRead":        {key, "old-1", []byte{0}, nil},
		"fingerprints":     {key, ids},
		"claimBatch":       {key, ids, hexFps, nil},
		"claimBatchNative": {key, ids, fps, nil},
		"acquire":          {key, "old-1", []byte{0}, int64(time.Minute / time.Microsecond)},
		"acquireStep":      {key, "old-1", []byte{0}, int64(time.Minute / time.Microsecond), "run:", "c"},
		"renew":            {int64(time.Minute / time.Microsecond), key, "old-1", int64(1)},
		"complete":         {[]byte("ok"), "text/plain", key, "old-1", int64(1)},
		"release":          {"failed", false, key, "old-1", int64(1)},
		"releaseStep":      {"failed", false, key, "old-1", int64(1), "settled:1", "c"},
		"saveStep":         {key, "old-1", int64(1), "charge", []byte("ok"), "c"},
		"purgeBatch":       {key, time.Now().UnixMicro(), int64(1000), "c"},
		"inspect":          {"c", "old-1"},
	}
	statements := idempgxv5.KeyedStatements(b.store)
	for name, query := range statements {
		a, ok := args[name]
		if !ok {
			t.Errorf("statement %s: the test has no arguments for it", name)
			continue
		}
		var modes []string
		if name == "purgeBatch" {
			// Its generic plan does not know the batch's LIMIT and takes
			// a tenth of the consumer's records to be deleted, by a hash
			// join over the whole table. PostgreSQL keeps the custom
			// plan, far cheaper by its own estimate, whose batch is the
			// LIMIT's size.
			modes = []string{"force_custom_plan"}
		}
		t.Run(name, func(t *testing.T) { probePlans(t, b, conn, query, a, modes...) })
	}
	if len(statements) != len(args) {
		t.Errorf("%d statements, arguments for %d", len(statements), len(args))
	}
}

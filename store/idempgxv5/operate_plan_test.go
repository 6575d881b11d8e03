package idempgxv5_test

import (
	"context"
	"strings"
	"testing"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/pgsql"
	"github.com/idem-go/idem/internal/pgsql/pgsqltest"
)

// TestOperatorReadPlans checks that the indexes serve every read of the
// operator capabilities (the console's pages: sqlstore.Ops.Reads) without
// reading a whole table: on a small analyzed table, with sequential and
// bitmap scans priced out (they stay possible when nothing else is), each
// statement's generic plan (a prepared statement's, as the console runs
// them) reads the records, steps and outbox tables by index scans only,
// fully sorts none of the rows it reads from them (only groups of them,
// after an aggregate), and sorts incrementally (within an index's order)
// only under a Limit. A statement that no index can serve this way would
// scan or sort a 10-million-record table on every page (docs/console.md,
// "At size").
func TestOperatorReadPlans(t *testing.T) {
	testURL(t)
	b := setup(t, poolOpts{})
	ctx := context.Background()
	t1, outbox := b.table, b.table+"_outbox"
	for _, s := range []string{
		`INSERT INTO ` + t1 + `_consumers (key, name) VALUES (1, 'c0'), (2, 'c1'), (3, 'c2')`,
		`INSERT INTO ` + t1 + ` (consumer_key, message_id, fingerprint, processed_at, state, token, attempt, lease_expires_at, last_error)
		SELECT (SELECT key FROM ` + t1 + `_consumers WHERE name = 'c' || (g % 3)), 'm-' || g, '\x01'::bytea, now() - g * interval '1 second',
			CASE WHEN g % 50 = 0 THEN 3 WHEN g % 70 = 0 THEN 1 ELSE 2 END, 1, 1, now(), CASE WHEN g % 50 = 0 THEN 'boom' END
		FROM generate_series(1, 3000) g`,
		`INSERT INTO ` + t1 + `_steps (consumer, message_id, step, result) SELECT c.name, r.message_id, 'charge', '\x01'::bytea FROM ` + t1 + ` r JOIN ` + t1 + `_consumers c ON c.key = r.consumer_key WHERE r.state = 3`,
		`INSERT INTO ` + outbox + ` (id, destination, payload, sent_at, failed_at, last_error)
		SELECT 'o-' || g, 'receipts', '\x00'::bytea, CASE WHEN g % 10 < 8 THEN now() END,
			CASE WHEN g % 10 = 9 THEN now() - g * interval '1 second' END, CASE WHEN g % 10 = 9 THEN 'e' || (g % 4) END
		FROM generate_series(1, 3000) g`,
		`ANALYZE ` + t1, `ANALYZE ` + t1 + `_steps`, `ANALYZE ` + outbox,
	} {
		if _, err := b.pool.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, s := range []string{`SET enable_seqscan = off`, `SET enable_bitmapscan = off`, `SET plan_cache_mode = force_generic_plan`} {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	defer conn.Exec(ctx, `RESET ALL`)

	// The arguments of a first and a later page (µs and a key).
	at, mid := int64(253370764800000000), "0"
	var pos int64
	if err := conn.QueryRow(ctx, `SELECT (extract(epoch FROM now() - interval '1000 seconds') * 1000000)::bigint`).Scan(&pos); err != nil {
		t.Fatal(err)
	}
	list := func(at int64, key string, state idemdriver.RecordState) []any {
		return []any{"c1", at, at, key, int64(idemdriver.DefaultScanLimit), int64(state), int64(52)}
	}
	reads := pgsql.OpsV2(b.table).Reads() // schema v2, as Migrate makes the table
	cases := []struct {
		name, read string
		args       []any
	}{
		{"consumers", "consumers", nil},
		{"failed records, first page", "listFailed", []any{"c1", at, at, mid, int64(51)}},
		{"failed records, later page", "listFailed", []any{"c1", pos, pos, "m-1000", int64(51)}},
		{"leases in progress, first page", "list", list(at, mid, idemdriver.StateInProgress)},
		{"leases in progress, later page", "list", list(pos, "m-1000", idemdriver.StateInProgress)},
		{"one record", "inspect", []any{"c1", "m-1"}},
		{"its steps", "steps", []any{"c1", "m-1"}},
		{"outbox failure groups", "failures", []any{int64(50)}},
		{"failed outbox rows, first page", "failed", []any{at, at, mid, int64(51)}},
		{"failed outbox rows, later page", "failed", []any{pos, pos, "o-1000", int64(51)}},
		{"failed outbox rows of one error", "failedOf", []any{at, at, mid, "e1", int64(51)}},
		{"outbox backlog", "backlog", nil},
	}
	if len(reads) != 9 {
		t.Fatalf("Ops.Reads has %d statements, the test knows 9: add the new ones to its cases", len(reads))
	}
	tables := map[string]bool{t1: true, t1 + "_steps": true, outbox: true}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			q, ok := reads[c.read]
			if !ok {
				t.Fatalf("Ops.Reads has no %q", c.read)
			}
			// EXPLAIN of a statement with parameters plans it for their
			// values; EXPLAIN EXECUTE of a prepared one plans it as the
			// server runs it (plan_cache_mode).
			if _, err := conn.Exec(ctx, `PREPARE read AS `+q); err != nil {
				t.Fatalf("%v: %s", err, q)
			}
			defer conn.Exec(ctx, `DEALLOCATE read`)
			var raw []byte
			if err := conn.QueryRow(ctx, `EXPLAIN (FORMAT JSON) EXECUTE read`+pgsqltest.ExecuteArgs(c.args)).Scan(&raw); err != nil {
				t.Fatalf("%v: %s", err, q)
			}
			plan := parsePlan(t, raw)
			var nodes []string
			plan.walk(func(n *planNode) { nodes = append(nodes, strings.TrimSpace(n.NodeType+" "+n.IndexName)) })
			t.Logf("%s", strings.Join(nodes, " / "))
			for _, bad := range unboundedReads(plan, tables) {
				t.Errorf("%s: %s", bad, raw)
			}
		})
	}
}

// unboundedReads returns what, in plan, reads one of tables whole: a scan
// of it other than an index scan; a Sort fed by such scans (not through an
// aggregate, whose rows are groups); an Incremental Sort with no Limit
// above it.
func unboundedReads(plan *planNode, tables map[string]bool) []string {
	var out []string
	var visit func(n *planNode, limited bool)
	visit = func(n *planNode, limited bool) {
		switch {
		case tables[n.RelationName] && !strings.HasPrefix(n.NodeType, "Index"):
			out = append(out, n.NodeType+" on "+n.RelationName)
		case n.NodeType == "Sort" && fedBy(n, tables):
			out = append(out, "a Sort of the rows of "+n.Plans[0].NodeType)
		case n.NodeType == "Incremental Sort" && !limited:
			out = append(out, "an Incremental Sort without a Limit above it")
		}
		limited = limited || n.NodeType == "Limit"
		for i := range n.Plans {
			visit(&n.Plans[i], limited)
		}
	}
	visit(plan, false)
	return out
}

// fedBy reports whether rows that n's input scanned from one of tables
// reach n itself: not through an aggregate, a subplan or an init plan.
func fedBy(n *planNode, tables map[string]bool) bool {
	if tables[n.RelationName] {
		return true
	}
	for i := range n.Plans {
		c := &n.Plans[i]
		if c.NodeType != "Aggregate" && c.ParentRelationship != "SubPlan" && c.ParentRelationship != "InitPlan" && fedBy(c, tables) {
			return true
		}
	}
	return false
}

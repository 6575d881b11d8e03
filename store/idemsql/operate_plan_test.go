package idemsql_test

import (
	"context"
	"strings"
	"testing"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idemsql"
)

// TestOperatorReadPlansSQLite checks how SQLite runs the reads of the
// operator capabilities (the console's pages) on an analyzed table:
// EXPLAIN QUERY PLAN shows no SCAN of the records, steps or outbox table
// (each is a SEARCH through an index, or the scan of a partial index that
// holds only the rows counted: the outbox backlog's pending rows), and the pages of failed records
// and failed outbox rows come in their index's order (no temporary
// B-tree for the ORDER BY), so a page reads its limit of rows.
func TestOperatorReadPlansSQLite(t *testing.T) {
	e := newEnv(t, idemsql.SQLite, envOptions{})
	ctx := context.Background()
	t1, outbox := e.table, e.table+"_outbox"
	for _, s := range []string{
		`WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < 3000)
		INSERT INTO ` + t1 + ` (consumer, message_id, fingerprint, processed_at, state, token, attempt, lease_expires_at, last_error)
		SELECT 'c' || (i % 3), 'm-' || i, x'01', 1000000 * i,
			CASE WHEN i % 50 = 0 THEN 3 WHEN i % 70 = 0 THEN 1 ELSE 2 END, 1, 1, 0, CASE WHEN i % 50 = 0 THEN 'boom' END FROM g`,
		`INSERT INTO ` + t1 + `_steps (consumer, message_id, step, result, created_at) SELECT consumer, message_id, 'charge', x'01', 0 FROM ` + t1 + ` WHERE state = 3`,
		`WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < 3000)
		INSERT INTO ` + outbox + ` (id, destination, payload, sent_at, failed_at, last_error)
		SELECT 'o-' || i, 'receipts', x'00', CASE WHEN i % 10 < 8 THEN i END,
			CASE WHEN i % 10 = 9 THEN 1000000 * i END, CASE WHEN i % 10 = 9 THEN 'e' || (i % 4) END FROM g`,
		`ANALYZE`,
	} {
		if _, err := e.db.ExecContext(ctx, s); err != nil {
			t.Fatalf("%v: %s", err, s)
		}
	}
	at, pos := int64(253370764800000000), int64(1000*1000000)
	list := func(at int64, key string) []any {
		return []any{"c1", at, at, key, int64(idemdriver.DefaultScanLimit), int64(idemdriver.StateInProgress), int64(52)}
	}
	reads := idemsql.OpsReads(e.store)
	cases := []struct {
		name, read string
		args       []any
		// ordered: the page must come in index order (no temporary
		// B-tree for its ORDER BY).
		ordered bool
	}{
		{"consumers", "consumers", nil, false},
		{"failed records, first page", "listFailed", []any{"c1", at, at, "0", int64(51)}, true},
		{"failed records, later page", "listFailed", []any{"c1", pos, pos, "m-1000", int64(51)}, true},
		{"leases in progress, first page", "list", list(at, "0"), false},
		{"leases in progress, later page", "list", list(pos, "m-1000"), false},
		{"one record", "inspect", []any{"c1", "m-1"}, false},
		{"its steps", "steps", []any{"c1", "m-1"}, false},
		{"outbox failure groups", "failures", []any{int64(50)}, false},
		{"failed outbox rows, first page", "failed", []any{at, at, "0", int64(51)}, true},
		{"failed outbox rows, later page", "failed", []any{pos, pos, "o-1000", int64(51)}, true},
		{"failed outbox rows of one error", "failedOf", []any{at, at, "0", "e1", int64(51)}, true},
		{"outbox backlog", "backlog", nil, false},
	}
	if len(reads) != 9 {
		t.Fatalf("Ops.Reads has %d statements, the test knows 9: add the new ones to its cases", len(reads))
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rows, err := e.db.QueryContext(ctx, `EXPLAIN QUERY PLAN `+reads[c.read], c.args...)
			if err != nil {
				t.Fatalf("%v: %s", err, reads[c.read])
			}
			defer rows.Close()
			var lines []string
			for rows.Next() {
				var id, parent, unused int
				var detail string
				if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
					t.Fatal(err)
				}
				lines = append(lines, detail)
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s", strings.Join(lines, " / "))
			for _, l := range lines {
				for _, tb := range []string{t1, t1 + "_steps", outbox} {
					if (l == "SCAN "+tb || strings.HasPrefix(l, "SCAN "+tb+" ")) && !partial(l) {
						t.Errorf("%q: a scan of %s", l, tb)
					}
				}
				if c.ordered && strings.Contains(l, "TEMP B-TREE FOR") && strings.Contains(l, "ORDER BY") {
					t.Errorf("%q: the page is sorted, not read in index order", l)
				}
			}
		})
	}
}

// partial reports whether plan line l scans a partial index (of the
// pending or the failed rows): only the rows it holds.
func partial(l string) bool {
	for _, suffix := range []string{"_outbox_pend", "_outbox_failed", "_failed_idx"} {
		if strings.Contains(l, " INDEX ") && strings.HasSuffix(l, suffix) {
			return true
		}
	}
	return false
}

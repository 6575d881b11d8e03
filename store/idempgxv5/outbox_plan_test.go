package idempgxv5_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/jackc/pgx/v5"
)

// TestOutboxClaimOrderCheckPlan checks how PostgreSQL runs the relay's
// claim on an analyzed outbox with a backlog of pending rows, each with an
// ordering key of its own (as when the key is the record key): the order
// check (an earlier pending row of the same destination and key?) probes
// the key index, and nothing in the plan walks the pending-rows index on
// seq more than once. A check run on that index reads every earlier
// pending row per row claimed: 20,000 pending rows made claims of 100
// take most of a second.
func TestOutboxClaimOrderCheckPlan(t *testing.T) {
	testURL(t)
	b := setup(t, poolOpts{})
	ctx := context.Background()
	outbox := b.table + "_outbox"
	if _, err := b.pool.Exec(ctx, `INSERT INTO `+outbox+` (id, destination, order_key, payload)
		SELECT 'id-' || g, 'orders', 'order-' || g || '-' || md5(g::text), '\x00'::bytea FROM generate_series(1, 20000) g`); err != nil {
		t.Fatal(err)
	}
	// The relay has sent the oldest 80%.
	if _, err := b.pool.Exec(ctx, `UPDATE `+outbox+` SET sent_at = now() WHERE seq <= (SELECT min(seq) + 16000 FROM `+outbox+`)`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `ANALYZE `+outbox); err != nil {
		t.Fatal(err)
	}
	keyIndex, pendIndex := b.table+"_outbox_khash", b.table+"_outbox_pend"
	// The leased rounds' claim, then the locked rounds' (which runs
	// its bound as an init plan first).
	for _, claim := range []func(*bundle) (string, []any){leasedClaim, lockedClaim} {
		sub, pendScans, raw := claimPlanOf(t, b.pool, b, claim)
		if sub.IndexName != keyIndex {
			t.Errorf("the order check runs as a %s on %q, want a scan of %s: %s", sub.NodeType, sub.IndexName, keyIndex, raw)
		}
		if pendScans != 1 {
			t.Errorf("the claim's plan scans %s %d times, want once (the rows in seq order): %s", pendIndex, pendScans, raw)
		}
	}

	// The pending-rows index is not one the check can run on at all, so
	// no cost estimate can make the planner pick it: without the key
	// index, the check still does not walk it.
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `DROP INDEX `+keyIndex); err != nil {
		t.Fatal(err)
	}
	sub, pendScans, raw := claimPlan(t, tx, b)
	if sub.IndexName == pendIndex || pendScans != 1 {
		t.Errorf("without the key index, the order check runs as a %s on %q, and the plan scans %s %d times (want once): %s",
			sub.NodeType, sub.IndexName, pendIndex, pendScans, raw)
	}
}

// claimPlan returns the plan of the relay's claim of 100 rows on q: the
// order check's subplan, how many of its nodes scan the pending-rows
// index, and the plan as JSON.
func claimPlan(t *testing.T, q planQuerier, b *bundle) (sub planNode, pendScans int, raw []byte) {
	return claimPlanOf(t, q, b, leasedClaim)
}

// planQuerier is what claimPlan explains on: a pool or a transaction.
type planQuerier interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}

// leasedClaim and lockedClaim are the claims of the two kinds of relay
// rounds, of 100 rows with a lease of 30 s, and their arguments.
func leasedClaim(b *bundle) (string, []any) {
	return idempgxv5.OutboxClaimSQL(b.store), []any{int64(100), int64(30_000_000)}
}

func lockedClaim(b *bundle) (string, []any) {
	return idempgxv5.OutboxLockedClaimSQL(b.store), []any{int64(100), "30000"}
}

// claimPlanOf is claimPlan of the claim statement claim returns.
func claimPlanOf(t *testing.T, q planQuerier, b *bundle, claim func(*bundle) (string, []any)) (sub planNode, pendScans int, raw []byte) {
	t.Helper()
	sql, args := claim(b)
	if err := q.QueryRow(context.Background(), `EXPLAIN (FORMAT JSON) `+sql, args...).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	plan := parsePlan(t, raw)
	found := false
	plan.walk(func(n *planNode) {
		if n.SubplanName != "" && n.ParentRelationship != "InitPlan" {
			sub, found = *n, true
		}
		if n.IndexName == b.table+"_outbox_pend" {
			pendScans++
		}
	})
	if !found {
		t.Fatalf("no subplan (the order check) in the claim's plan: %s", raw)
	}
	return sub, pendScans, raw
}

// planNode is one node of EXPLAIN (FORMAT JSON).
type planNode struct {
	NodeType  string `json:"Node Type"`
	IndexName string `json:"Index Name"`
	IndexCond string `json:"Index Cond"`
	// RelationName is the table a scan reads (a partition's name, for a
	// partition).
	RelationName string `json:"Relation Name"`
	SubplanName  string `json:"Subplan Name"`
	// ParentRelationship is how the node feeds its parent: "Outer",
	// "Inner", "SubPlan", "InitPlan", ...
	ParentRelationship string `json:"Parent Relationship"`
	// ActualLoops is how many times the node ran (EXPLAIN ANALYZE only).
	ActualLoops float64    `json:"Actual Loops"`
	Plans       []planNode `json:"Plans"`
}

// parsePlan reads the plan of EXPLAIN (FORMAT JSON).
func parsePlan(t *testing.T, raw []byte) *planNode {
	t.Helper()
	var plan []struct{ Plan planNode }
	if err := json.Unmarshal(raw, &plan); err != nil || len(plan) != 1 {
		t.Fatalf("plan %s: %v", raw, err)
	}
	return &plan[0].Plan
}

func (n *planNode) walk(f func(*planNode)) {
	f(n)
	for i := range n.Plans {
		n.Plans[i].walk(f)
	}
}

// TestOutboxMarkFailedPlannedPerCall: the relay's failure mark, one
// UPDATE of array parameters, is planned for each call's arrays even
// under pgx's default mode, which prepares a statement once: PostgreSQL
// gives such a statement a generic plan from its sixth run on, which
// guesses 10 rows per array and joined 1,000 rows by reading the arrays
// again for every outbox row (about a second a call, where the first
// five took 10 ms). Eight marks of 1,000 rows on one connection leave no
// generic plan of the statement behind, and every row marked.
func TestOutboxMarkFailedPlannedPerCall(t *testing.T) {
	testURL(t)
	b := setup(t, poolOpts{maxConns: 1})
	ctx := context.Background()
	if mode := b.pool.Config().ConnConfig.DefaultQueryExecMode; mode != pgx.QueryExecModeCacheStatement {
		t.Fatalf("the pool's mode is %v, want pgx's default, QueryExecModeCacheStatement", mode)
	}
	outbox := b.table + "_outbox"
	if _, err := b.pool.Exec(ctx, `INSERT INTO `+outbox+` (id, destination, payload, attempts)
		SELECT 'id-' || g, 'orders', '\x00'::bytea, 1 FROM generate_series(1, 1000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `ANALYZE `+outbox); err != nil {
		t.Fatal(err)
	}
	rows := make([]idemdriver.FailedRow, 1000)
	for i := range rows {
		rows[i] = idemdriver.FailedRow{ID: fmt.Sprintf("id-%d", i+1), Attempt: 1, RetryAfter: time.Hour, Error: "refused"}
	}
	for call := range 8 {
		rows[0].Error = fmt.Sprintf("refused %d", call)
		if err := b.store.MarkFailed(ctx, &idemdriver.MarkFailedParams{Rows: rows}); err != nil {
			t.Fatalf("mark %d: %v", call, err)
		}
	}
	var generic int64
	if err := b.pool.QueryRow(ctx, `SELECT COALESCE(sum(generic_plans), 0) FROM pg_prepared_statements
		WHERE statement LIKE '%FROM unnest(%' AND statement NOT LIKE '%pg_prepared_statements%'`).Scan(&generic); err != nil {
		t.Fatal(err)
	}
	if generic != 0 {
		t.Errorf("the failure mark ran %d times with a generic plan on the connection, want 0", generic)
	}
	var marked int64
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+outbox+`
		WHERE last_error IS NOT NULL AND available_at > now() + interval '59 minutes'`).Scan(&marked); err != nil {
		t.Fatal(err)
	}
	if marked != 1000 {
		t.Errorf("%d rows marked for a retry in an hour, want 1000", marked)
	}
}

// TestOutboxMarkFailedReadsItsArraysOnce: statistics taken while every
// row of the outbox was sent (a relay that keeps up) make PostgreSQL take
// "sent_at IS NULL" to match no row. The failure mark, an UPDATE joined
// to its arrays, then started from the outbox, took the rows to mark for
// one, and read the arrays again for every row it marked: 0.6 to 1 s a
// call for 1,000 rows, quadratic in the rows per call, and a relay whose
// destination is down marks its whole claim failed at once. On the custom
// and the generic plan, the mark must read its arrays once.
func TestOutboxMarkFailedReadsItsArraysOnce(t *testing.T) {
	testURL(t)
	b := setup(t, poolOpts{maxConns: 1})
	ctx := context.Background()
	outbox := b.table + "_outbox"
	for _, q := range []string{
		`INSERT INTO ` + outbox + ` (id, destination, payload, attempts, sent_at)
			SELECT 'sent-' || g, 'orders', '\x00'::bytea, 1, now() FROM generate_series(1, 20000) g`,
		`VACUUM ANALYZE ` + outbox,
		`ALTER TABLE ` + outbox + ` SET (autovacuum_enabled = off)`,
		`INSERT INTO ` + outbox + ` (id, destination, payload, attempts)
			SELECT 'id-' || g, 'orders', '\x00'::bytea, 1 FROM generate_series(1, 1000) g`,
	} {
		if _, err := b.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	n := 1000
	ids, attempts, permanent, retry, errs, seqs := make([]string, n), make([]int64, n), make([]bool, n), make([]int64, n), make([]string, n), make([]int64, n)
	for i := range n {
		ids[i], attempts[i], retry[i], errs[i] = fmt.Sprintf("id-%d", i+1), 1, int64(time.Hour/time.Microsecond), "refused"
	}
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `PREPARE mark AS `+idempgxv5.OutboxMarkFailedSQL(b.store)); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var raw []byte
		if _, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode = `+mode); err != nil {
			t.Fatal(err)
		}
		// EXECUTE takes no parameters of its own: the simple protocol
		// writes the arrays into the text as literals.
		err = tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE mark($1, $2, $3, $4, $5, $6)`,
			pgx.QueryExecModeSimpleProtocol, ids, attempts, permanent, retry, errs, seqs).Scan(&raw)
		if rerr := tx.Rollback(ctx); err == nil {
			err = rerr
		}
		if err != nil {
			t.Fatal(err)
		}
		plan := parsePlan(t, raw)
		scans := 0
		plan.walk(func(n *planNode) {
			if n.NodeType != "Function Scan" {
				return
			}
			scans++
			if n.ActualLoops > 1 {
				t.Errorf("%s: the arrays were read %v times: %s", mode, n.ActualLoops, raw)
			}
		})
		if scans == 0 {
			t.Errorf("%s: no scan of the arrays in the plan: %s", mode, raw)
		}
	}
}

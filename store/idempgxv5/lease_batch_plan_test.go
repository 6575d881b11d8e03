package idempgxv5_test

import (
	"context"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/pgsql/pgsqltest"
	"github.com/idem-go/idem/store/idempgxv5"
)

// TestLeaseBatchPlansAgainAsTableGrows: on a new table that nothing
// analyzes, lease batches of new messages grow it to 20,480 records; the
// batch statements are prepared again as the table grows, so that the
// last records' batches scan nothing (pgsqltest.CheckBatchPlansAgainAsTableGrows).
func TestLeaseBatchPlansAgainAsTableGrows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, poolOpts{maxConns: 1})
	if _, err := b.pool.Exec(ctx, `ALTER TABLE `+b.table+` SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	q := func(ctx context.Context, dest []any, query string, args ...any) error {
		return b.pool.QueryRow(ctx, query, args...).Scan(dest...)
	}
	pgsqltest.CheckBatchPlansAgainAsTableGrows(t, ctx, b.store, q, b.table)
}

// TestLeaseBatchPlanGenerationFromTableRows: on a table whose statistics
// count 20,000 records when the store first finds its shape, the first
// lease batches already run the statements of plan generation 5 (20,000
// records known: 1,024 doubled four times and more), not those of
// generation 0 that a new table starts with, so that a process starting
// on a large table does not prepare and plan them again as its own
// batches reach 1,024, 2,048, ... records.
func TestLeaseBatchPlanGenerationFromTableRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, poolOpts{maxConns: 1})
	for _, q := range []string{
		recordsInsert(b.table, true, "'c'", "message_id, fingerprint") + `'h-' || g, sha256(g::text::bytea) FROM generate_series(1, 20000) g`,
		`ANALYZE ` + b.table,
	} {
		if _, err := b.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	// A store that finds the table's shape now (setup's store found it
	// empty).
	st, err := idempgxv5.New(b.pool, &idempgxv5.Config{Table: b.table})
	if err != nil {
		t.Fatal(err)
	}
	ps := []*idemdriver.AcquireParams{
		{Consumer: "c", MessageID: "new-1", Fingerprint: fp("a"), Lease: time.Minute, StepPrefix: "run:"},
		{Consumer: "c", MessageID: "new-2", Fingerprint: fp("a"), Lease: time.Minute, StepPrefix: "run:"},
	}
	res, errs, err := st.AcquireBatch(ctx, ps)
	if err != nil {
		t.Fatal(err)
	}
	cps := make([]*idemdriver.CompleteParams, len(ps))
	for i, r := range res {
		if errs[i] != nil || !r.Acquired || r.Token != 1 {
			t.Fatalf("element %d: %+v, %v; want acquired with token 1", i, r, errs[i])
		}
		cps[i] = &idemdriver.CompleteParams{Consumer: "c", MessageID: ps[i].MessageID, Token: r.Token, Result: []byte("ok")}
	}
	cerrs, err := st.CompleteBatch(ctx, cps)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range cerrs {
		if e != nil {
			t.Fatalf("complete %d: %v", i, e)
		}
	}
	var gen5, other int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE statement LIKE '%-- idem plan generation 5'),
		count(*) FILTER (WHERE statement LIKE '%-- idem plan generation%' AND statement NOT LIKE '%-- idem plan generation 5')
		FROM pg_prepared_statements WHERE statement NOT LIKE '%pg_prepared_statements%'`).Scan(&gen5, &other); err != nil {
		t.Fatal(err)
	}
	if gen5 != 2 || other != 0 {
		t.Fatalf("prepared batch statements: %d of plan generation 5, %d of another; want the acquire's and the completion's of generation 5 only", gen5, other)
	}
	var done int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.table+` WHERE message_id IN ('new-1', 'new-2') AND state = 2`).Scan(&done); err != nil || done != 2 {
		t.Fatalf("%d records completed, %v; want 2", done, err)
	}
}

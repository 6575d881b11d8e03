package idempgxv5_test

import (
	"context"
	"testing"

	"github.com/idem-go/idem/internal/pgsql/pgsqltest"
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

package idemsql_test

import (
	"context"
	"testing"

	"github.com/idem-go/idem/internal/pgsql/pgsqltest"
	"github.com/idem-go/idem/store/idemsql"
)

// TestLeaseBatchPlansAgainAsTableGrows: on PostgreSQL through
// database/sql (pgx's statement cache), lease batches of new messages
// grow a new table that nothing analyzes to 20,480 records; the batch
// statements are prepared again as the table grows, so that the last
// records' batches scan nothing
// (pgsqltest.CheckBatchPlansAgainAsTableGrows).
func TestLeaseBatchPlansAgainAsTableGrows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, idemsql.Postgres, envOptions{})
	// One connection: the statistics flushed before each count are the
	// batches'.
	e.db.SetMaxOpenConns(1)
	if _, err := e.db.ExecContext(ctx, `ALTER TABLE `+e.table+` SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	q := func(ctx context.Context, dest []any, query string, args ...any) error {
		return e.db.QueryRowContext(ctx, query, args...).Scan(dest...)
	}
	pgsqltest.CheckBatchPlansAgainAsTableGrows(t, ctx, e.store, q, e.table)
}

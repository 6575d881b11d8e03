package idempgxv5

import (
	"context"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/pgsql"
	"github.com/idem-go/idem/internal/sqlschema"
	"github.com/jackc/pgx/v5"
)

// MigrateWith applies migs to s's table as Migrate applies the embedded
// migrations (tests: a rehearsal of an online upgrade).
func MigrateWith(ctx context.Context, s *Store, migs []sqlschema.Migration) error {
	return s.migrate(ctx, migs)
}

// EnsurePartitionsAt creates the partitions of the partitioned layout from
// the bucket of at on (tests: records moved back in time need them).
func EnsurePartitionsAt(ctx context.Context, s *Store, at time.Time) error {
	return s.ensureAt(ctx, at)
}

// OutboxClaimSQL is the relay's claim statement on s's outbox: limit
// ($1, rows) and lease ($2, microseconds).
func OutboxClaimSQL(s *Store) string { return s.outbox().ClaimSQL() }

// OutboxLockedClaimSQL is the claim of a locked relay round on s's outbox:
// limit $1, the bound's milliseconds $2 (text).
func OutboxLockedClaimSQL(s *Store) string { return s.outbox().LockedClaimSQL() }

// PartitionedClaimBatchSQL is the batch claim statement of s, whose table
// is in the partitioned layout: consumer ($1), text[] of IDs ($2), bytea[]
// of fingerprints ($3).
func PartitionedClaimBatchSQL(s *Store) string { return s.part.q.ClaimBatch }

// ClaimBatchQuery is the batch claim statement of s (default layout) for
// p, and its arguments.
func ClaimBatchQuery(s *Store, p *idemdriver.ClaimBatchParams) (string, []any) {
	return shapeOf(s).ClaimBatchQuery(p)
}

// KeyedStatements are the statements of s (default layout) that find
// records by key, by name (pgsql.Queries.Keyed).
func KeyedStatements(s *Store) map[string]string { return shapeOf(s).Keyed() }

// shapeOf is the statements of s's table's shape (default layout).
func shapeOf(s *Store) *pgsql.Queries {
	q, err := s.tab.Shape(context.Background(), querier{s.pool})
	if err != nil {
		panic(err)
	}
	return q
}

// OutboxMarkFailedSQL is the relay's failure mark on s's outbox: IDs ($1),
// attempts ($2), permanent ($3), retry delays in µs ($4), errors ($5),
// seqs ($6, 0 for none).
func OutboxMarkFailedSQL(s *Store) string { return s.outbox().MarkFailedSQL() }

// SetAfterConflict sets the hook BeginClaim runs between a claim that
// conflicted and the read of the record (nil: none), and returns a
// function that removes it.
func SetAfterConflict(f func()) func() {
	afterConflict = f
	return func() { afterConflict = nil }
}

// AcquireFirstOn is Store.Acquire whose first acquire statement runs in
// first, a transaction begun earlier (so that its now() is older than
// what its snapshot may show), which it then rolls back; any statement
// after it runs on the pool, as Acquire's do.
func AcquireFirstOn(ctx context.Context, s *Store, first pgx.Tx, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	q, err := s.tab.Queries(ctx, querier{s.pool}, p.Consumer, true)
	if err != nil {
		return idemdriver.AcquireResult{}, err
	}
	query, args := q.AcquireQuery(p)
	a := pgsql.ScanAcquire(row{first.QueryRow(ctx, query, args...)})
	if err := first.Rollback(ctx); err != nil {
		return idemdriver.AcquireResult{}, err
	}
	return q.AcquireFrom(ctx, querier{s.pool}, p, a)
}

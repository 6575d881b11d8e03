package idemsql

import (
	"context"
	"sync"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/pgsql"
	"github.com/idem-go/idem/internal/sqlstore"
)

// The operator capabilities.
var (
	_ idemdriver.Operator       = (*Store)(nil)
	_ idemdriver.OutboxOperator = (*Store)(nil)
	_ idemdriver.ConsumerLister = (*Store)(nil)
	_ idemdriver.StepReader     = (*Store)(nil)
)

// opsCache caches the operator statements per dialect and table.
var opsCache sync.Map // dialect + " " + table -> *sqlstore.Ops

func (s *Store) ops() *sqlstore.Ops {
	key := string(s.dialect) + " " + s.table.Qualified
	if o, ok := opsCache.Load(key); ok {
		return o.(*sqlstore.Ops)
	}
	var o *sqlstore.Ops
	switch s.dialect {
	case Postgres:
		o = pgsql.Ops(s.table.Qualified) // schema v1; withOps picks the table's shape
	case MySQL:
		o = sqlstore.NewOps(s.table.Qualified, s.q.inspect, s.outbox(), func(string) string { return mysqlTimeParam })
	default:
		// SQLite lists failed records through its partial index of them
		// (migration 005); MySQL has no partial indexes.
		o = sqlstore.NewOps(s.table.Qualified, s.q.inspect, s.outbox(), func(p string) string { return p }).WithFailedIndex()
	}
	got, _ := opsCache.LoadOrStore(key, o)
	return got.(*sqlstore.Ops)
}

// withOps runs f with the operator statements of s's table: on
// PostgreSQL those of the table's shape (found on the pool when not
// known), again once when the shape changed under it (pgsql.Retry).
func withOps[T any](ctx context.Context, s *Store, f func(o *sqlstore.Ops) (T, error)) (T, error) {
	if s.dialect != Postgres {
		return f(s.ops())
	}
	return pgsql.WithOps(ctx, s.pg, querier{s.db}, f)
}

// ListRecords implements [idemdriver.Operator]: one statement that walks
// the (consumer, processed_at) index backwards from the cursor and reads
// at most p.Scan records. SQLite's times have millisecond precision, so
// records of one millisecond page by message ID.
func (s *Store) ListRecords(ctx context.Context, p *idemdriver.ListRecordsParams) (idemdriver.RecordPage, error) {
	return withOps(ctx, s, func(o *sqlstore.Ops) (idemdriver.RecordPage, error) { return o.ListRecords(ctx, querier{s.db}, p) })
}

// RetryRecord implements [idemdriver.Operator]: one UPDATE by primary
// key, then a read of the record.
func (s *Store) RetryRecord(ctx context.Context, consumer, messageID string) (idemdriver.ActionResult, error) {
	return withOps(ctx, s, func(o *sqlstore.Ops) (idemdriver.ActionResult, error) {
		return o.RetryRecord(ctx, querier{s.db}, consumer, messageID)
	})
}

// ReleaseLease implements [idemdriver.Operator]: one UPDATE by primary
// key fenced by the token, then a read of the record.
func (s *Store) ReleaseLease(ctx context.Context, p *idemdriver.ReleaseLeaseParams) (idemdriver.ActionResult, error) {
	return withOps(ctx, s, func(o *sqlstore.Ops) (idemdriver.ActionResult, error) { return o.ReleaseLease(ctx, querier{s.db}, p) })
}

// OutboxFailures implements [idemdriver.OutboxOperator]: one GROUP BY
// over the failed rows (the index on failed_at).
func (s *Store) OutboxFailures(ctx context.Context, limit int) ([]idemdriver.FailureGroup, error) {
	return withOps(ctx, s, func(o *sqlstore.Ops) ([]idemdriver.FailureGroup, error) {
		return o.OutboxFailures(ctx, querier{s.db}, limit)
	})
}

// ListFailedOutgoing implements [idemdriver.OutboxOperator], newest
// failure first, from the cursor.
func (s *Store) ListFailedOutgoing(ctx context.Context, p *idemdriver.ListOutgoingParams) (idemdriver.OutgoingPage, error) {
	return withOps(ctx, s, func(o *sqlstore.Ops) (idemdriver.OutgoingPage, error) {
		return o.ListFailedOutgoing(ctx, querier{s.db}, p)
	})
}

// RetryOutgoing implements [idemdriver.OutboxOperator]: one UPDATE by
// primary key, then a read of the row's state.
func (s *Store) RetryOutgoing(ctx context.Context, id string) (idemdriver.ActionResult, error) {
	return withOps(ctx, s, func(o *sqlstore.Ops) (idemdriver.ActionResult, error) { return o.RetryOutgoing(ctx, querier{s.db}, id) })
}

// Consumers implements [idemdriver.ConsumerLister]: one statement, a skip
// scan of the (consumer, processed_at) index (a recursive CTE), and two
// index probes per consumer for its oldest and newest record.
func (s *Store) Consumers(ctx context.Context) ([]idemdriver.ConsumerStats, error) {
	return withOps(ctx, s, func(o *sqlstore.Ops) ([]idemdriver.ConsumerStats, error) { return o.Consumers(ctx, querier{s.db}) })
}

// OutboxBacklog implements [idemdriver.OutboxOperator]: counts of the
// pending and the failed rows, and the oldest pending row's age, each
// through the index of those rows.
func (s *Store) OutboxBacklog(ctx context.Context) (idemdriver.OutboxStats, error) {
	return withOps(ctx, s, func(o *sqlstore.Ops) (idemdriver.OutboxStats, error) { return o.OutboxBacklog(ctx, querier{s.db}) })
}

// Steps implements [idemdriver.StepReader]: one read of the recovery
// points table by its primary key.
func (s *Store) Steps(ctx context.Context, consumer, messageID string) ([]idemdriver.Step, error) {
	return withOps(ctx, s, func(o *sqlstore.Ops) ([]idemdriver.Step, error) {
		return o.Steps(ctx, querier{s.db}, consumer, messageID)
	})
}

package idempgxv5

import (
	"context"

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

// withOps runs f with the operator statements of the table's shape
// (found on the pool when not known), again once when the shape changed
// under it (pgsql.Retry).
func withOps[T any](ctx context.Context, s *Store, f func(o *sqlstore.Ops) (T, error)) (T, error) {
	return pgsql.WithOps(ctx, s.tab, querier{s.pool}, f)
}

// ListRecords implements [idemdriver.Operator]: one statement that walks
// the (consumer, processed_at) index backwards from the cursor and reads
// at most p.Scan records (an Index Scan Backward under a Limit).
func (s *Store) ListRecords(ctx context.Context, p *idemdriver.ListRecordsParams) (idemdriver.RecordPage, error) {
	return withOps(ctx, s, func(o *sqlstore.Ops) (idemdriver.RecordPage, error) { return o.ListRecords(ctx, querier{s.pool}, p) })
}

// RetryRecord implements [idemdriver.Operator]: one UPDATE by primary
// key, then a read of the record.
func (s *Store) RetryRecord(ctx context.Context, consumer, messageID string) (idemdriver.ActionResult, error) {
	return withOps(ctx, s, func(o *sqlstore.Ops) (idemdriver.ActionResult, error) {
		return o.RetryRecord(ctx, querier{s.pool}, consumer, messageID)
	})
}

// ReleaseLease implements [idemdriver.Operator]: one UPDATE by primary
// key fenced by the token (the holder's own Release, without its error
// text), then a read of the record.
func (s *Store) ReleaseLease(ctx context.Context, p *idemdriver.ReleaseLeaseParams) (idemdriver.ActionResult, error) {
	return withOps(ctx, s, func(o *sqlstore.Ops) (idemdriver.ActionResult, error) { return o.ReleaseLease(ctx, querier{s.pool}, p) })
}

// OutboxFailures implements [idemdriver.OutboxOperator]: one GROUP BY
// over the failed rows (the partial index on failed_at).
func (s *Store) OutboxFailures(ctx context.Context, limit int) ([]idemdriver.FailureGroup, error) {
	return withOps(ctx, s, func(o *sqlstore.Ops) ([]idemdriver.FailureGroup, error) {
		return o.OutboxFailures(ctx, querier{s.pool}, limit)
	})
}

// ListFailedOutgoing implements [idemdriver.OutboxOperator]: a walk of
// the partial index on failed_at, newest first, from the cursor.
func (s *Store) ListFailedOutgoing(ctx context.Context, p *idemdriver.ListOutgoingParams) (idemdriver.OutgoingPage, error) {
	return withOps(ctx, s, func(o *sqlstore.Ops) (idemdriver.OutgoingPage, error) {
		return o.ListFailedOutgoing(ctx, querier{s.pool}, p)
	})
}

// RetryOutgoing implements [idemdriver.OutboxOperator]: one UPDATE by
// primary key, then a read of the row's state.
func (s *Store) RetryOutgoing(ctx context.Context, id string) (idemdriver.ActionResult, error) {
	return withOps(ctx, s, func(o *sqlstore.Ops) (idemdriver.ActionResult, error) {
		return o.RetryOutgoing(ctx, querier{s.pool}, id)
	})
}

// Consumers implements [idemdriver.ConsumerLister]: one statement, a skip
// scan of the (consumer, processed_at) index (a recursive CTE), and two
// index probes per consumer for its oldest and newest record.
func (s *Store) Consumers(ctx context.Context) ([]idemdriver.ConsumerStats, error) {
	return withOps(ctx, s, func(o *sqlstore.Ops) ([]idemdriver.ConsumerStats, error) { return o.Consumers(ctx, querier{s.pool}) })
}

// OutboxBacklog implements [idemdriver.OutboxOperator]: counts of the
// pending and the failed rows, and the oldest pending row's age, each
// through the index of those rows.
func (s *Store) OutboxBacklog(ctx context.Context) (idemdriver.OutboxStats, error) {
	return withOps(ctx, s, func(o *sqlstore.Ops) (idemdriver.OutboxStats, error) { return o.OutboxBacklog(ctx, querier{s.pool}) })
}

// Steps implements [idemdriver.StepReader]: one read of the recovery
// points table by its primary key.
func (s *Store) Steps(ctx context.Context, consumer, messageID string) ([]idemdriver.Step, error) {
	return withOps(ctx, s, func(o *sqlstore.Ops) ([]idemdriver.Step, error) {
		return o.Steps(ctx, querier{s.pool}, consumer, messageID)
	})
}

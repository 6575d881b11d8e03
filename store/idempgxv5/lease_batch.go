package idempgxv5

import (
	"context"
	"errors"
	"iter"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/pgsql"
	"github.com/idem-go/idem/internal/sqlstore"
)

var _ idemdriver.LeaseBatcher = (*Store)(nil)

// AcquireBatch implements [idemdriver.LeaseBatcher]: the acquire statement
// of Acquire for each element, in key order, sent as one pipelined
// pgx.Batch (pool.SendBatch: one network round trip, one Sync), which
// PostgreSQL runs as one implicit transaction, so the batch costs one
// commit (the WAL flush of a durable server) instead of one per message.
// Each statement judges its record on its own snapshot (READ COMMITTED),
// as a single Acquire does; the batch holds the rows it inserted or took
// over until it commits, and a concurrent Acquire of one of them waits
// for the commit. The leases start at the transaction's start (now()).
//
// What a single Acquire does after its statement runs after the batch
// commits, element by element, on the pool: reading a takeover's recovery
// points (a new snapshot, as a single Acquire's), or the statement again
// when it waited for a row its snapshot could not show. An error of those
// is the element's, in errs, like one that fails validation; a statement
// of the batch that fails rolls the whole batch back (err). On the
// partitioned layout it returns ErrLeaseUnsupported.
func (s *Store) AcquireBatch(ctx context.Context, ps []*idemdriver.AcquireParams) (res []idemdriver.AcquireResult, errs []error, err error) {
	if s.part != nil {
		return nil, nil, ErrLeaseUnsupported
	}
	if err := ctx.Err(); err != nil || len(ps) == 0 {
		return nil, nil, err
	}
	order, errs, err := sqlstore.AcquireOrder(ps)
	if err != nil {
		return nil, nil, err
	}
	res = make([]idemdriver.AcquireResult, len(ps))
	if len(order) == 0 {
		return res, errs, nil
	}
	q, rows, err := s.acquireRows(ctx, ps, order)
	if s.tab.Changed(err) { // migration 015 ran: the batch, rolled back, once more in the new shape
		q, rows, err = s.acquireRows(ctx, ps, order)
	}
	if err != nil {
		return nil, nil, err
	}
	for k, i := range order {
		res[i], errs[i] = q.AcquireFrom(ctx, querier{s.pool}, ps[i], rows[k])
	}
	return res, errs, nil
}

// acquireRows sends the acquire statements of the elements order names
// of ps, in the table's shape, as one batch, and returns their rows and
// the statements used; a statement that fails fails the batch (err).
func (s *Store) acquireRows(ctx context.Context, ps []*idemdriver.AcquireParams, order []int) (*pgsql.Queries, []pgsql.AcquireRow, error) {
	q, err := s.batchShape(ctx, func(yield func(string) bool) {
		for _, i := range order {
			if !yield(ps[i].Consumer) {
				return
			}
		}
	})
	if err != nil {
		return nil, nil, err
	}
	b := &pgx.Batch{}
	for _, i := range order {
		query, args := q.AcquireQuery(ps[i])
		b.Queue(query, args...)
	}
	br := s.pool.SendBatch(ctx, b)
	rows := make([]pgsql.AcquireRow, len(order))
	for k := range order {
		rows[k] = pgsql.ScanAcquire(row{br.QueryRow()})
		if err := rows[k].Err(); err != nil && !errors.Is(err, sqlstore.ErrNoRows) {
			_ = br.Close()
			return nil, nil, err
		}
	}
	if err := br.Close(); err != nil {
		return nil, nil, err
	}
	return q, rows, nil
}

// CompleteBatch implements [idemdriver.LeaseBatcher]: the fenced UPDATE of
// Complete for each element, in key order, sent as one pipelined
// pgx.Batch that PostgreSQL runs as one implicit transaction (one round
// trip, one commit). An element whose token no longer owns its record
// (no row updated) has an error matching idemdriver.ErrLeaseLost and
// changes nothing; one that fails validation has its error; a statement
// that fails rolls the whole batch back (err). On the partitioned layout
// it returns ErrLeaseUnsupported.
func (s *Store) CompleteBatch(ctx context.Context, ps []*idemdriver.CompleteParams) (errs []error, err error) {
	if s.part != nil {
		return nil, ErrLeaseUnsupported
	}
	if err := ctx.Err(); err != nil || len(ps) == 0 {
		return nil, err
	}
	order, errs, err := sqlstore.CompleteOrder(ps)
	if err != nil || len(order) == 0 {
		return errs, err
	}
	lost, err := s.completeRows(ctx, ps, order)
	if s.tab.Changed(err) { // migration 015 ran: the batch, rolled back, once more in the new shape
		lost, err = s.completeRows(ctx, ps, order)
	}
	if err != nil {
		return nil, err
	}
	for _, i := range lost {
		p := ps[i]
		errs[i] = sqlstore.LeaseLost("complete", p.Consumer, p.MessageID, p.Token)
	}
	return errs, nil
}

// completeRows sends the complete statements of the elements order names
// of ps, in the table's shape, as one batch, and returns the elements
// whose token owned nothing; a statement that fails fails the batch
// (err).
func (s *Store) completeRows(ctx context.Context, ps []*idemdriver.CompleteParams, order []int) (lost []int, err error) {
	q, err := s.batchShape(ctx, func(yield func(string) bool) {
		for _, i := range order {
			if !yield(ps[i].Consumer) {
				return
			}
		}
	})
	if err != nil {
		return nil, err
	}
	b := &pgx.Batch{}
	for _, i := range order {
		query, args := q.CompleteQuery(ps[i])
		b.Queue(query, args...)
	}
	br := s.pool.SendBatch(ctx, b)
	for _, i := range order {
		tag, err := br.Exec()
		if err != nil {
			_ = br.Close()
			return nil, err
		}
		if tag.RowsAffected() == 0 {
			lost = append(lost, i)
		}
	}
	if err := br.Close(); err != nil {
		return nil, err
	}
	return lost, nil
}

// batchShape returns the statements of the table's shape for a batch of
// lease statements of the consumers named by consumers, each added to
// the consumers table on v2 (pgsql.Table.Ensure) on the pool.
func (s *Store) batchShape(ctx context.Context, consumers iter.Seq[string]) (*pgsql.Queries, error) {
	q, err := s.tab.Shape(ctx, querier{s.pool})
	if err != nil || !q.V2 {
		return q, err
	}
	for c := range consumers {
		if err := s.tab.Ensure(ctx, querier{s.pool}, c, true); err != nil {
			return nil, err
		}
	}
	return q, nil
}

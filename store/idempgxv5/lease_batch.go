package idempgxv5

import (
	"context"
	"errors"

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
	b := &pgx.Batch{}
	for _, i := range order {
		query, args := s.q.AcquireQuery(ps[i])
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
	for k, i := range order {
		res[i], errs[i] = s.q.AcquireFrom(ctx, querier{s.pool}, ps[i], rows[k])
	}
	return res, errs, nil
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
	b := &pgx.Batch{}
	for _, i := range order {
		query, args := s.q.CompleteQuery(ps[i])
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
			p := ps[i]
			errs[i] = sqlstore.LeaseLost("complete", p.Consumer, p.MessageID, p.Token)
		}
	}
	if err := br.Close(); err != nil {
		return nil, err
	}
	return errs, nil
}

package idempgxv5

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/sqlstore"
)

var _ idemdriver.LeaseBatcher = (*Store)(nil)

// AcquireBatch implements [idemdriver.LeaseBatcher]: the statements of
// Acquire for each element, in key order, in one transaction, so the
// batch costs one commit (the WAL flush of a durable server) instead of
// one per message. Each statement judges its record on its own snapshot
// (READ COMMITTED), as a single Acquire does; the batch holds the rows it
// inserted or took over until it commits, and a concurrent Acquire of
// one of them waits for the commit. The leases start at the
// transaction's start (now()). An element that fails validation has its
// error in errs; a statement that fails rolls the whole batch back (err).
// On the partitioned layout it returns ErrLeaseUnsupported.
func (s *Store) AcquireBatch(ctx context.Context, ps []*idemdriver.AcquireParams) (res []idemdriver.AcquireResult, errs []error, err error) {
	if s.part != nil {
		return nil, nil, ErrLeaseUnsupported
	}
	if err := ctx.Err(); err != nil || len(ps) == 0 {
		return nil, nil, err
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		res, errs, err = sqlstore.AcquireBatch(ctx, ps, func(p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
			return s.q.Acquire(ctx, querier{tx}, p)
		})
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return res, errs, nil
}

// CompleteBatch implements [idemdriver.LeaseBatcher]: the fenced UPDATE of
// Complete for each element, in key order, in one transaction (one
// commit). An element whose token no longer owns its record has an error
// matching idemdriver.ErrLeaseLost and changes nothing; one that fails
// validation has its error; a statement that fails rolls the whole batch
// back (err). On the partitioned layout it returns ErrLeaseUnsupported.
func (s *Store) CompleteBatch(ctx context.Context, ps []*idemdriver.CompleteParams) (errs []error, err error) {
	if s.part != nil {
		return nil, ErrLeaseUnsupported
	}
	if err := ctx.Err(); err != nil || len(ps) == 0 {
		return nil, err
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		errs, err = sqlstore.CompleteBatch(ctx, ps, func(p *idemdriver.CompleteParams) error {
			return s.q.Complete(ctx, querier{tx}, p)
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	return errs, nil
}

package idemsql

import (
	"context"
	"database/sql"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/sqlstore"
)

var _ idemdriver.LeaseBatcher = (*Store)(nil)

// AcquireBatch implements [idemdriver.LeaseBatcher]. On PostgreSQL the
// batch is one statement over arrays, store/idempgxv5's (one round trip,
// one commit; see its AcquireBatch): each element is judged as a single
// Acquire judges it, what a single Acquire does after its statement (a
// takeover's recovery points, the statement again) runs after it element
// by element, as does an element whose record an earlier one names. On
// SQLite the statements of Acquire for each element run in key order in
// one BEGIN IMMEDIATE transaction, so the batch costs one commit instead
// of one per message, and its leases start at the transaction's clock.
// An element that fails validation has its error in errs; a statement
// that fails rolls the whole batch back (err). On MySQL, whose Acquire
// runs its own short transactions, the batch is one Acquire per element,
// in order, with no saving.
func (s *Store) AcquireBatch(ctx context.Context, ps []*idemdriver.AcquireParams) (res []idemdriver.AcquireResult, errs []error, err error) {
	if err := ctx.Err(); err != nil || len(ps) == 0 {
		return nil, nil, err
	}
	acquire := func(p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) { return s.Acquire(ctx, p) }
	switch s.dialect {
	case MySQL:
		return sqlstore.AcquireBatch(ctx, ps, acquire)
	case Postgres:
		return s.pg.AcquireBatch(ctx, querier{s.db}, ps)
	}
	s.prepareSQLiteLease(ctx)
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		acquire = func(p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
			var last *sqlstore.LeaseRecord
			for range maxClaimAttempts {
				res, rec, err := s.acquireSQLiteTx(ctx, s.prepared(tx), p)
				if err != nil || res.Acquired || res.State != 0 {
					return res, err
				}
				last = rec
			}
			return last.NotAcquired(), nil
		}
		var err error
		res, errs, err = sqlstore.AcquireBatch(ctx, ps, acquire)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return res, errs, nil
}

// CompleteBatch implements [idemdriver.LeaseBatcher]. On PostgreSQL the
// batch is one statement over arrays, store/idempgxv5's (one round trip,
// one commit; see its CompleteBatch), an element whose record an earlier
// one names running alone after it. On MySQL and SQLite the fenced
// UPDATE of Complete runs for each element, in key order, in one
// transaction (one commit). An element whose token no longer owns its
// record has an error matching idemdriver.ErrLeaseLost and changes
// nothing; one that fails validation has its error; a statement that
// fails changes nothing (err).
func (s *Store) CompleteBatch(ctx context.Context, ps []*idemdriver.CompleteParams) (errs []error, err error) {
	if err := ctx.Err(); err != nil || len(ps) == 0 {
		return nil, err
	}
	switch s.dialect {
	case Postgres:
		return s.pg.CompleteBatch(ctx, querier{s.db}, ps)
	case SQLite:
		s.prepareSQLiteLease(ctx)
	}
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		var err error
		errs, err = sqlstore.CompleteBatch(ctx, ps, func(p *idemdriver.CompleteParams) error {
			return sqlstore.Fenced(ctx, querier{s.prepared(tx)}, "complete", p.Consumer, p.MessageID, p.Token, s.lq.complete,
				sqlstore.NonNil(p.Result), p.ContentType, p.Consumer, p.MessageID, p.Token)
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	return errs, nil
}

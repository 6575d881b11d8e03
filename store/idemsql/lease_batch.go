package idemsql

import (
	"context"
	"database/sql"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/pgsql"
	"github.com/idem-go/idem/internal/sqlstore"
)

var _ idemdriver.LeaseBatcher = (*Store)(nil)

// AcquireBatch implements [idemdriver.LeaseBatcher]. On PostgreSQL and
// SQLite the statements of Acquire for each element run in key order in
// one transaction (on SQLite a BEGIN IMMEDIATE one), so the batch costs
// one commit instead of one per message; each element is judged as a
// single Acquire judges it, and its leases start at the transaction's
// clock. An element that fails validation has its error in errs; a
// statement that fails rolls the whole batch back (err). On MySQL, whose
// Acquire runs its own short transactions, the batch is one Acquire per
// element, in order, with no saving.
func (s *Store) AcquireBatch(ctx context.Context, ps []*idemdriver.AcquireParams) (res []idemdriver.AcquireResult, errs []error, err error) {
	if err := ctx.Err(); err != nil || len(ps) == 0 {
		return nil, nil, err
	}
	acquire := func(p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) { return s.Acquire(ctx, p) }
	if s.dialect == MySQL {
		return sqlstore.AcquireBatch(ctx, ps, acquire)
	}
	if s.dialect == SQLite {
		s.prepareSQLiteLease(ctx)
	}
	err = s.inTxAgain(ctx, func(tx *sql.Tx) error {
		if s.dialect == Postgres {
			acquire = func(p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
				return pgsql.InTx(ctx, s.pg, querier{tx}, p.Consumer, func(q *pgsql.Queries) (idemdriver.AcquireResult, error) {
					return q.Acquire(ctx, querier{tx}, p)
				})
			}
		} else {
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

// CompleteBatch implements [idemdriver.LeaseBatcher]: the fenced UPDATE of
// Complete for each element, in key order, in one transaction (one
// commit). An element whose token no longer owns its record has an error
// matching idemdriver.ErrLeaseLost and changes nothing; one that fails
// validation has its error; a statement that fails rolls the whole batch
// back (err).
func (s *Store) CompleteBatch(ctx context.Context, ps []*idemdriver.CompleteParams) (errs []error, err error) {
	if err := ctx.Err(); err != nil || len(ps) == 0 {
		return nil, err
	}
	if s.dialect == SQLite {
		s.prepareSQLiteLease(ctx)
	}
	err = s.inTxAgain(ctx, func(tx *sql.Tx) error {
		var err error
		errs, err = sqlstore.CompleteBatch(ctx, ps, func(p *idemdriver.CompleteParams) error {
			if s.dialect == Postgres {
				_, err := pgsql.InTx(ctx, s.pg, querier{tx}, p.Consumer, func(q *pgsql.Queries) (struct{}, error) {
					return struct{}{}, q.Complete(ctx, querier{tx}, p)
				})
				return err
			}
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

// inTxAgain is inTx, run once more on PostgreSQL when a statement failed
// because the table's shape changed under the Store (migration 015 ran;
// pgsql.InTx made it find the shape again): the transaction, the
// Store's own, rolled back, so the batch is made again in the new shape.
func (s *Store) inTxAgain(ctx context.Context, fn func(tx *sql.Tx) error) error {
	err := s.inTx(ctx, fn)
	if s.dialect == Postgres && pgsql.ShapeChanged(err) {
		err = s.inTx(ctx, fn)
	}
	return err
}

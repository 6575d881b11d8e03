package idemsql

import (
	"context"
	"database/sql"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/sqlstore"
)

var _ idemdriver.LeaseBatchRenewer = (*Store)(nil)

// RenewBatch implements [idemdriver.LeaseBatchRenewer]: every lease of ps
// renewed as Renew renews it, to the database's now plus its lease while
// its token owns the record, in one round trip or one transaction:
//
//   - PostgreSQL: one statement over arrays (consumers, message IDs,
//     tokens, leases), which locks the rows in key order and skips those
//     another transaction holds locked rather than wait (FOR UPDATE SKIP
//     LOCKED): such an element is neither extended nor judged, and its
//     error matches idemdriver.ErrRenewNotJudged (the LeaseConsumer then
//     renews it alone).
//   - MySQL/MariaDB and SQLite: one transaction (one commit) of the
//     fenced UPDATE of Renew per lease, in key order, on the prepared
//     statement; a row another transaction holds locked is waited for, as
//     by Renew, with the whole batch (which is why the LeaseConsumer does
//     not batch on MySQL: see RenewsBatches).
//
// Per element: nil when extended, an error matching idemdriver.ErrLeaseLost
// when its token does not own the record, the error of
// idemdriver.ValidateRenewParams when invalid. err is the whole batch's:
// more than idemdriver.MaxLeaseBatch elements (matching
// idemdriver.ErrInvalidConfig), an ended ctx, a failed statement or
// transaction (nothing renewed).
func (s *Store) RenewBatch(ctx context.Context, ps []idemdriver.RenewParams) ([]error, error) {
	if err := ctx.Err(); err != nil || len(ps) == 0 {
		return nil, err
	}
	if s.dialect == Postgres {
		order, errs, err := sqlstore.RenewOrder(ps)
		if err != nil || len(order) == 0 {
			return errs, err
		}
		if err := s.pg.RenewBatch(ctx, querier{s.db}, ps, order, errs); err != nil {
			return nil, err
		}
		return errs, nil
	}
	if s.dialect == SQLite {
		s.prepareSQLiteLease(ctx)
	}
	var errs []error
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		var err error
		errs, err = sqlstore.RenewBatch(ctx, ps, func(p *idemdriver.RenewParams) error {
			return sqlstore.Fenced(ctx, querier{s.prepared(tx)}, "renew", p.Consumer, p.MessageID, p.Token, s.lq.renew,
				sqlstore.DurationMicros(p.Lease), p.Consumer, p.MessageID, p.Token)
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	return errs, nil
}

// RenewsBatches implements [idemdriver.LeaseBatchRenewer]: true on
// PostgreSQL and SQLite, false on MySQL/MariaDB, whose batch waits on a
// row another transaction holds locked with every lease of the batch (so
// one locked record would cost the others their leases): there the
// LeaseConsumer renews each lease alone, as before batches. SQLite has
// one writer, so any transaction holding it stops every renewal, batched
// or not.
func (s *Store) RenewsBatches() bool { return s.dialect != MySQL }

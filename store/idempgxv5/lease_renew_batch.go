package idempgxv5

import (
	"context"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/sqlstore"
)

var _ idemdriver.LeaseBatchRenewer = (*Store)(nil)

// RenewBatch implements [idemdriver.LeaseBatchRenewer]: one statement
// (one round trip, one commit) renews every lease of ps, passed as arrays
// of consumers, message IDs, tokens and leases, each to the server's
// now() plus its lease while its token owns the record, as Renew does.
// It locks the rows in key order and skips those another transaction
// holds locked rather than wait (FOR UPDATE SKIP LOCKED): such an element
// is neither extended nor judged, and its error matches
// idemdriver.ErrRenewNotJudged (the LeaseConsumer then renews it alone).
// Per element: nil when extended, an error matching
// idemdriver.ErrLeaseLost when its token does not own the record, the
// error of idemdriver.ValidateRenewParams when invalid. err is the whole
// batch's: more than idemdriver.MaxLeaseBatch elements (matching
// idemdriver.ErrInvalidConfig), an ended ctx, a failed statement (nothing
// renewed). On the partitioned layout it returns ErrLeaseUnsupported.
func (s *Store) RenewBatch(ctx context.Context, ps []idemdriver.RenewParams) ([]error, error) {
	if s.part != nil {
		return nil, ErrLeaseUnsupported
	}
	if err := ctx.Err(); err != nil || len(ps) == 0 {
		return nil, err
	}
	order, errs, err := sqlstore.RenewOrder(ps)
	if err != nil || len(order) == 0 {
		return errs, err
	}
	if err := s.tab.RenewBatch(ctx, querier{s.pool}, ps, order, errs); err != nil {
		return nil, err
	}
	return errs, nil
}

// RenewsBatches implements [idemdriver.LeaseBatchRenewer]: true, except on
// the partitioned layout, which has no lease mode.
func (s *Store) RenewsBatches() bool { return s.part == nil }

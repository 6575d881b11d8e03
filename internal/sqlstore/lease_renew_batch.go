package sqlstore

import (
	"context"

	"github.com/idem-go/idem/idemdriver"
)

// RenewOrder validates a batch of renewals (idemdriver.LeaseBatchRenewer):
// it returns the indexes of the valid elements of ps in key order (the
// order their rows are locked), and one error per element, that of its
// validation or nil. err is the batch's: more than
// idemdriver.MaxLeaseBatch elements.
func RenewOrder(ps []idemdriver.RenewParams) (order []int, errs []error, err error) {
	return batchOrder(ps, func(p idemdriver.RenewParams) (string, string) { return p.Consumer, p.MessageID },
		func(p idemdriver.RenewParams) error { return idemdriver.ValidateRenewParams(&p) })
}

// RenewBatch runs renew (one fenced Renew on the batch's transaction, p
// validated) for each element of ps in key order and returns one error
// per element of ps: its validation error, or ErrLeaseLost; any other
// error ends the batch.
func RenewBatch(ctx context.Context, ps []idemdriver.RenewParams, renew func(p *idemdriver.RenewParams) error) ([]error, error) {
	order, errs, err := RenewOrder(ps)
	if err != nil {
		return nil, err
	}
	return fencedBatch(ctx, ps, order, errs, func(p idemdriver.RenewParams) error { return renew(&p) })
}

package idemdriver

import (
	"context"
	"errors"
)

// LeaseBatchRenewer is an optional capability of a LeaseStore, found by
// type assertion: the renewal of many leases, each under its own fencing
// token, in one store round trip (one statement over arrays, one script
// call or pipeline, or one transaction), for a process that holds many
// attempts at once. The core's renewal scheduler gathers the renewals
// that come due together into batches of at most MaxLeaseBatch and sends
// each with RenewBatch when RenewsBatches returns true; otherwise it
// sends one Renew per lease.
//
// Each element is judged exactly as Renew would judge it, on its own: a
// lease another attempt took over, or that its attempt released or
// completed, fails that element alone with ErrLeaseLost and changes
// nothing, and the other elements are renewed all the same. A store that
// writes the elements in an order of its own (by key, so that two batches
// lock rows in one order) still reports the results in the order given.
type LeaseBatchRenewer interface {
	LeaseStore
	// RenewBatch extends the lease of each of ps, as Renew would, to the
	// store's now plus its Lease, and returns one error per element, in
	// order: nil when that lease was extended; one matching ErrLeaseLost
	// when its token no longer owns the record; one matching
	// ErrInvalidConfig (or another validation error of
	// ValidateRenewParams) when the element is invalid; one matching
	// ErrRenewNotJudged when the store left that element alone without
	// judging it (its record was locked by another transaction, which the
	// batch does not wait for): such an element was not extended and is
	// to be sent again on its own (Renew). err is an error of the whole
	// batch (a lost connection, a timeout, more than MaxLeaseBatch
	// elements): then errs is nil and each element may or may not have
	// been extended, as with a Renew whose reply was lost. An empty ps
	// returns nothing.
	RenewBatch(ctx context.Context, ps []RenewParams) (errs []error, err error)
	// RenewsBatches reports whether RenewBatch renews the batch in one
	// round trip. A wrapper around a store should implement it by asking
	// the store it wraps, and a wrapper that overrides Renew without
	// RenewBatch should return false, so that its Renew is the one used.
	RenewsBatches() bool
}

// ErrRenewNotJudged is the error of an element of
// LeaseBatchRenewer.RenewBatch that the store did not judge: neither
// extended nor found lost (its record was locked by another transaction,
// and the batch skipped it rather than wait). The caller renews it again
// on its own.
var ErrRenewNotJudged = errors.New("idem: renewal not judged in its batch (record locked); renew it alone")

// BatchRenewer returns s as a LeaseBatchRenewer when it is one and its
// RenewsBatches returns true.
func BatchRenewer(s LeaseStore) (LeaseBatchRenewer, bool) {
	r, ok := s.(LeaseBatchRenewer)
	if !ok || !r.RenewsBatches() {
		return nil, false
	}
	return r, true
}

package idempgxv5

import (
	"context"

	"github.com/idem-go/idem/idemdriver"
)

var _ idemdriver.LeaseBatcher = (*Store)(nil)

// AcquireBatch implements [idemdriver.LeaseBatcher] with one statement
// (one round trip, one commit) for the whole batch: an INSERT ... SELECT
// FROM unnest(arrays of the elements) ... ON CONFLICT DO UPDATE ...
// RETURNING, in key order, that inserts each new record and takes over
// each expired one of the same fingerprint as a single Acquire does, and
// in the same statement reads the records of the other elements (held,
// completed, failed, another fingerprint) as of its snapshot, with the
// remaining lease counted by the server's clock after every lock wait. A
// step prefix's recovery point is saved in the same statement. The
// leases start at the statement's start (now()).
//
// What a single Acquire does after its statement runs after the batch
// commits, element by element, on the pool: reading a takeover's recovery
// points (a new snapshot, as a single Acquire's), or the statement again
// when it waited for a row its snapshot could not show. An element whose
// record an earlier element of the batch already names runs alone after
// the batch (it finds the record as the earlier one left it). An error of
// those is the element's, in errs, like one that fails validation; the
// statement that fails changes nothing (err). On the partitioned layout
// it returns ErrLeaseUnsupported.
func (s *Store) AcquireBatch(ctx context.Context, ps []*idemdriver.AcquireParams) (res []idemdriver.AcquireResult, errs []error, err error) {
	if s.part != nil {
		return nil, nil, ErrLeaseUnsupported
	}
	if err := ctx.Err(); err != nil || len(ps) == 0 {
		return nil, nil, err
	}
	return s.tab.AcquireBatch(ctx, querier{s.pool}, ps)
}

// CompleteBatch implements [idemdriver.LeaseBatcher] with one statement
// (one round trip, one commit): an UPDATE ... FROM unnest(arrays of the
// elements) of every record whose token owns it (in_progress, the
// element's token), locked in key order, as Complete updates one. An
// element whose token no longer owns its record (not updated) has an
// error matching idemdriver.ErrLeaseLost and changes nothing; one that
// fails validation has its error; an element whose record an earlier one
// names runs alone after the batch. A statement that fails changes
// nothing (err). On the partitioned layout it returns
// ErrLeaseUnsupported.
func (s *Store) CompleteBatch(ctx context.Context, ps []*idemdriver.CompleteParams) (errs []error, err error) {
	if s.part != nil {
		return nil, ErrLeaseUnsupported
	}
	if err := ctx.Err(); err != nil || len(ps) == 0 {
		return nil, err
	}
	return s.tab.CompleteBatch(ctx, querier{s.pool}, ps)
}

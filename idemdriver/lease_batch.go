package idemdriver

import (
	"context"
	"fmt"
)

// LeaseBatcher is an optional capability of a LeaseStore, found by type
// assertion: Acquire and Complete of many records in one store round trip
// and one commit (one transaction, or one pipeline of scripts), for a
// process that holds many messages at once (the idem consume sidecar
// claims and completes what one broker fetch handed it).
//
// Each element is judged exactly as the single call would judge it, in
// the order given (a later element sees what an earlier one wrote: the
// second of two Acquires of one record in a batch finds it held), with the
// single call's validation per element. A store may reorder the elements
// it writes (by key, so that two batches lock rows in one order) but
// reports the results in the order given.
type LeaseBatcher interface {
	LeaseStore
	// AcquireBatch acquires each of ps as Acquire would (AcquireParams.
	// StepPrefix included, on a StepRecorder) and returns one result per
	// element, in order; an element that fails alone has its error in
	// errs (nil when it did not fail). err is an error of the whole batch:
	// then no result is returned, and an element may or may not have been
	// acquired, as with a single Acquire whose reply was lost (a record
	// acquired so is held by nobody and is taken over when its lease runs
	// out). An empty ps returns nothing.
	AcquireBatch(ctx context.Context, ps []*AcquireParams) (res []AcquireResult, errs []error, err error)
	// CompleteBatch completes each of ps as Complete would, fenced by its
	// token, and returns one error per element (nil when it completed;
	// one matching ErrLeaseLost when its token no longer owns the
	// record, which leaves the others unaffected). err is an error of the
	// whole batch: each element may or may not have been completed.
	CompleteBatch(ctx context.Context, ps []*CompleteParams) (errs []error, err error)
}

// MaxLeaseBatch is the most elements an AcquireBatch or CompleteBatch
// takes.
const MaxLeaseBatch = 1000

// ValidateBatchSize checks the size of a lease batch: at most
// MaxLeaseBatch elements. The error matches ErrInvalidConfig.
func ValidateBatchSize(n int) error {
	if n > MaxLeaseBatch {
		return fmt.Errorf("%w: lease batch of %d elements, over the maximum of %d", ErrInvalidConfig, n, MaxLeaseBatch)
	}
	return nil
}

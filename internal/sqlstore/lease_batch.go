package sqlstore

import (
	"cmp"
	"context"
	"errors"
	"slices"

	"github.com/idem-go/idem/idemdriver"
)

// keyOrder returns the indexes 0..n-1 sorted by the key (consumer, message
// ID) of each, the order in which a batch locks its rows, so that two
// batches never wait for each other in a cycle.
func keyOrder(n int, key func(i int) (string, string)) []int {
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		ca, ia := key(a)
		cb, ib := key(b)
		return cmp.Or(cmp.Compare(ca, cb), cmp.Compare(ia, ib))
	})
	return order
}

// AcquireOrder validates a batch of acquires: it returns the indexes of
// the valid elements of ps in key order (the order their statements
// run), and one error per element, that of its validation or nil. err is
// the batch's: too many elements.
func AcquireOrder(ps []*idemdriver.AcquireParams) (order []int, errs []error, err error) {
	return batchOrder(ps, func(p *idemdriver.AcquireParams) (string, string) { return p.Consumer, p.MessageID },
		idemdriver.ValidateAcquireParams)
}

// CompleteOrder is AcquireOrder for a batch of completions: validation
// includes the content type (CheckContentType).
func CompleteOrder(ps []*idemdriver.CompleteParams) (order []int, errs []error, err error) {
	return batchOrder(ps, func(p *idemdriver.CompleteParams) (string, string) { return p.Consumer, p.MessageID },
		func(p *idemdriver.CompleteParams) error {
			if err := idemdriver.ValidateCompleteParams(p); err != nil {
				return err
			}
			return CheckContentType(p.ContentType)
		})
}

func batchOrder[P any](ps []P, key func(P) (string, string), validate func(P) error) ([]int, []error, error) {
	if err := idemdriver.ValidateBatchSize(len(ps)); err != nil {
		return nil, nil, err
	}
	errs := make([]error, len(ps))
	order := keyOrder(len(ps), func(i int) (string, string) { return key(ps[i]) })
	valid := order[:0]
	for _, i := range order {
		if errs[i] = validate(ps[i]); errs[i] == nil {
			valid = append(valid, i)
		}
	}
	return valid, errs, nil
}

// AcquireBatch runs acquire (one Acquire on the batch's transaction, p
// validated) for each element of ps in key order and returns the results
// in the order of ps: an element that fails validation has its error in
// errs; any other error ends the batch (the caller rolls its transaction
// back).
func AcquireBatch(ctx context.Context, ps []*idemdriver.AcquireParams, acquire func(p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error)) ([]idemdriver.AcquireResult, []error, error) {
	order, errs, err := AcquireOrder(ps)
	if err != nil {
		return nil, nil, err
	}
	res := make([]idemdriver.AcquireResult, len(ps))
	for _, i := range order {
		r, err := acquire(ps[i])
		if err != nil {
			return nil, nil, err
		}
		res[i] = r
	}
	return res, errs, ctx.Err()
}

// AcquireEach is AcquireBatch for a store whose Acquire commits on its
// own (MySQL's short transactions, one or two per element): it runs
// acquire for each valid element of ps in key order and an error is that
// element's alone, in errs. The elements before it stay acquired, and
// reporting its error as the batch's would leave them held by nobody
// until their leases ran out (each a wasted attempt); the elements after
// it are tried, as a single Acquire of each would be (one whose ctx has
// ended fails with ctx's error without a statement). err is only the
// batch's size.
func AcquireEach(ps []*idemdriver.AcquireParams, acquire func(p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error)) ([]idemdriver.AcquireResult, []error, error) {
	order, errs, err := AcquireOrder(ps)
	if err != nil {
		return nil, nil, err
	}
	res := make([]idemdriver.AcquireResult, len(ps))
	for _, i := range order {
		res[i], errs[i] = acquire(ps[i])
	}
	return res, errs, nil
}

// CompleteBatch runs complete (one fenced Complete on the batch's
// transaction, p validated) for each element of ps in key order and
// returns one error per element of ps: its validation error, or
// ErrLeaseLost; any other error ends the batch.
func CompleteBatch(ctx context.Context, ps []*idemdriver.CompleteParams, complete func(p *idemdriver.CompleteParams) error) ([]error, error) {
	order, errs, err := CompleteOrder(ps)
	if err != nil {
		return nil, err
	}
	return fencedBatch(ctx, ps, order, errs, complete)
}

// fencedBatch runs write (one fenced write on the batch's transaction)
// for the elements order names, in that order, and sets each one's error
// in errs: nil or ErrLeaseLost; any other error ends the batch.
func fencedBatch[P any](ctx context.Context, ps []P, order []int, errs []error, write func(p P) error) ([]error, error) {
	for _, i := range order {
		err := write(ps[i])
		if err != nil && !errors.Is(err, idemdriver.ErrLeaseLost) {
			return nil, err
		}
		errs[i] = err
	}
	return errs, ctx.Err()
}

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

// AcquireBatch runs acquire (one Acquire on the batch's transaction, p
// validated) for each element of ps in key order and returns the results
// in the order of ps: an element that fails validation has its error in
// errs; any other error ends the batch (the caller rolls its transaction
// back).
func AcquireBatch(ctx context.Context, ps []*idemdriver.AcquireParams, acquire func(p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error)) ([]idemdriver.AcquireResult, []error, error) {
	if err := idemdriver.ValidateBatchSize(len(ps)); err != nil {
		return nil, nil, err
	}
	res := make([]idemdriver.AcquireResult, len(ps))
	errs := make([]error, len(ps))
	for _, i := range keyOrder(len(ps), func(i int) (string, string) { return ps[i].Consumer, ps[i].MessageID }) {
		if errs[i] = idemdriver.ValidateAcquireParams(ps[i]); errs[i] != nil {
			continue
		}
		r, err := acquire(ps[i])
		if err != nil {
			return nil, nil, err
		}
		res[i] = r
	}
	return res, errs, ctx.Err()
}

// CompleteBatch runs complete (one fenced Complete on the batch's
// transaction, p validated) for each element of ps in key order and
// returns one error per element of ps: its validation error, or
// ErrLeaseLost; any other error ends the batch.
func CompleteBatch(ctx context.Context, ps []*idemdriver.CompleteParams, complete func(p *idemdriver.CompleteParams) error) ([]error, error) {
	if err := idemdriver.ValidateBatchSize(len(ps)); err != nil {
		return nil, err
	}
	errs := make([]error, len(ps))
	for _, i := range keyOrder(len(ps), func(i int) (string, string) { return ps[i].Consumer, ps[i].MessageID }) {
		p := ps[i]
		if errs[i] = idemdriver.ValidateCompleteParams(p); errs[i] != nil {
			continue
		}
		if errs[i] = CheckContentType(p.ContentType); errs[i] != nil {
			continue
		}
		err := complete(p)
		if err != nil && !errors.Is(err, idemdriver.ErrLeaseLost) {
			return nil, err
		}
		errs[i] = err
	}
	return errs, ctx.Err()
}

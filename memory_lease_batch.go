package idem

import (
	"context"

	"github.com/idem-go/idem/idemdriver"
)

// MemoryStore batches lease calls too (one call per element, in order).
var _ idemdriver.LeaseBatcher = (*MemoryStore)(nil)

// AcquireBatch implements idemdriver.LeaseBatcher: Acquire of each
// element, in order.
func (s *MemoryStore) AcquireBatch(ctx context.Context, ps []*idemdriver.AcquireParams) ([]idemdriver.AcquireResult, []error, error) {
	if err := idemdriver.ValidateBatchSize(len(ps)); err != nil {
		return nil, nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	res := make([]idemdriver.AcquireResult, len(ps))
	errs := make([]error, len(ps))
	for i, p := range ps {
		res[i], errs[i] = s.Acquire(ctx, p)
	}
	return res, errs, nil
}

// CompleteBatch implements idemdriver.LeaseBatcher: Complete of each
// element, in order.
func (s *MemoryStore) CompleteBatch(ctx context.Context, ps []*idemdriver.CompleteParams) ([]error, error) {
	if err := idemdriver.ValidateBatchSize(len(ps)); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	errs := make([]error, len(ps))
	for i, p := range ps {
		errs[i] = s.Complete(ctx, p)
	}
	return errs, nil
}

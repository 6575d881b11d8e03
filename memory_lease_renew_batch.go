package idem

import (
	"context"

	"github.com/idem-go/idem/idemdriver"
)

// MemoryStore renews leases in batches (one call per element, in order).
var _ idemdriver.LeaseBatchRenewer = (*MemoryStore)(nil)

// RenewBatch implements idemdriver.LeaseBatchRenewer: Renew of each
// element, in order, each judged on its own (ErrLeaseLost for a lease
// taken over, released or completed). An empty ps returns nothing; more
// than idemdriver.MaxLeaseBatch elements is an error matching
// ErrInvalidConfig, and an ended ctx its error, each for the whole batch.
func (s *MemoryStore) RenewBatch(ctx context.Context, ps []idemdriver.RenewParams) ([]error, error) {
	if err := idemdriver.ValidateBatchSize(len(ps)); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil || len(ps) == 0 {
		return nil, err
	}
	errs := make([]error, len(ps))
	for i := range ps {
		errs[i] = s.Renew(ctx, &ps[i])
	}
	return errs, nil
}

// RenewsBatches implements idemdriver.LeaseBatchRenewer: true.
func (s *MemoryStore) RenewsBatches() bool { return true }

package idempgxv5

import (
	"context"
	"time"
)

// EnsurePartitionsAt creates the partitions of the partitioned layout from
// the bucket of at on (tests: records moved back in time need them).
func EnsurePartitionsAt(ctx context.Context, s *Store, at time.Time) error {
	return s.ensureAt(ctx, at)
}

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

// OutboxClaimSQL is the relay's claim statement on s's outbox: limit
// ($1, rows) and lease ($2, microseconds).
func OutboxClaimSQL(s *Store) string { return s.outbox().ClaimSQL() }

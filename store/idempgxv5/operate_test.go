package idempgxv5_test

import (
	"testing"

	"github.com/idem-go/idem/idemtest"
	"github.com/jackc/pgx/v5"
)

// TestOperate runs the idemtest operator cases: the records' list and
// actions, and the outbox's.
func TestOperate(t *testing.T) {
	t.Parallel()
	t.Run("Records", func(t *testing.T) {
		t.Parallel()
		idemtest.RunOperate(t, leaseHarness(pgx.QueryExecModeCacheStatement))
	})
	t.Run("Outbox", func(t *testing.T) {
		t.Parallel()
		idemtest.RunOutboxOperate(t, harness(pgx.QueryExecModeCacheStatement))
	})
}

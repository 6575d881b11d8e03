package idempgxv5_test

import (
	"testing"

	"github.com/idem-go/idem/idemtest"
)

// Renewal batches racing the Completes of their own records: PostgreSQL's
// statement over arrays (FOR UPDATE SKIP LOCKED) meets each Complete's
// row lock and commit (idemtest.RenewBatchRacingCompletes).
func TestBreakit2RenewBatchRacingCompletes(t *testing.T) {
	t.Parallel()
	bb := setup(t, poolOpts{})
	idemtest.RenewBatchRacingCompletes(t, &idemtest.LeaseSetup{Store: bb.store, ExpireLease: bb.expireLease})
}

package idemredis_test

import (
	"testing"

	"github.com/idem-go/idem/idemtest"
)

// Renewal batches (one pipeline of the renew script) racing the
// Completes of their own records (idemtest.RenewBatchRacingCompletes).
func TestBreakit2RenewBatchRacingCompletes(t *testing.T) {
	t.Parallel()
	idemtest.RenewBatchRacingCompletes(t, setup(t, nil).leaseSetup())
}

package idemredis_test

import (
	"testing"

	"github.com/idem-go/idem/idemtest"
)

// TestLeaseConformance runs idem's lease-mode conformance suite on a
// single Redis server, each case under a key prefix of its own.
func TestLeaseConformance(t *testing.T) {
	t.Parallel()
	client := newClient(t)
	idemtest.RunLease(t, idemtest.LeaseHarness{New: func(t *testing.T) *idemtest.LeaseSetup {
		return setup(t, client).leaseSetup()
	}})
}

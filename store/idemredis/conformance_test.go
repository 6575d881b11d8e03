package idemredis_test

import (
	"testing"

	"github.com/idem-go/idem/idemtest"
	"github.com/redis/go-redis/v9"
)

// leaseSetup adapts a bundle to idemtest.
func (b *testBundle) leaseSetup() *idemtest.LeaseSetup {
	return &idemtest.LeaseSetup{
		Store:        b.store,
		ExpireLease:  b.store.ExpireLease,
		CountRecords: b.store.CountRecords,
		Shift:        b.store.Shift,
	}
}

// TestLeaseConformance runs idem's lease-mode conformance suite on a
// single Redis server, each case under a key prefix of its own.
func TestLeaseConformance(t *testing.T) {
	t.Parallel()
	client := newClient(t)
	idemtest.RunLease(t, idemtest.LeaseHarness{New: func(t *testing.T) *idemtest.LeaseSetup {
		return setup(t, client).leaseSetup()
	}})
}

// clusterConformance runs the lease-mode conformance suite on cc, for
// TestCluster: a script touching keys of two slots would fail with
// CROSSSLOT.
func clusterConformance(t *testing.T, cc *redis.ClusterClient) {
	idemtest.RunLease(t, idemtest.LeaseHarness{New: func(t *testing.T) *idemtest.LeaseSetup {
		return setup(t, cc).leaseSetup()
	}})
}

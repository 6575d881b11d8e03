package idem_test

import (
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest"
)

func TestMemoryStoreOperate(t *testing.T) {
	t.Parallel()
	t.Run("FakeClock", func(t *testing.T) {
		t.Parallel()
		idemtest.RunOperate(t, idemtest.LeaseHarness{New: func(t *testing.T) *idemtest.LeaseSetup {
			return newMemoryLeaseSetup(newFakeClock().Now)
		}})
	})
	t.Run("RealClock", func(t *testing.T) {
		t.Parallel()
		idemtest.RunOperate(t, idemtest.LeaseHarness{New: func(t *testing.T) *idemtest.LeaseSetup {
			return newMemoryLeaseSetup(nil)
		}})
	})
	t.Run("Outbox", func(t *testing.T) {
		t.Parallel()
		idemtest.RunOutboxOperate(t, idemtest.Harness[*idem.MemoryTx]{New: func(t *testing.T) *idemtest.Setup[*idem.MemoryTx] {
			_, s := newMemorySetup(t)
			return s
		}})
	})
}

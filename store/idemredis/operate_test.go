package idemredis_test

import (
	"testing"

	"github.com/idem-go/idem/idemtest"
)

// TestOperate runs the idemtest operator cases: the failed records'
// list, retry and release (Redis cannot list the records in progress).
func TestOperate(t *testing.T) {
	t.Parallel()
	client := newClient(t)
	idemtest.RunOperate(t, idemtest.LeaseHarness{New: func(t *testing.T) *idemtest.LeaseSetup {
		return setup(t, client).leaseSetup()
	}})
}

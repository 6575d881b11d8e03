package idemnats_test

import (
	"testing"

	"github.com/idem-go/idem/broker/brokertest"
)

// TestConformanceInProcess runs the broker conformance suite against an
// in-process JetStream server.
func TestConformanceInProcess(t *testing.T) {
	t.Parallel()
	conn := inProcess(t)
	brokertest.Run(t, brokertest.Harness{New: func(t *testing.T) brokertest.Broker { return newNATSBroker(t, conn) }})
}

// TestConformanceExternal runs the broker conformance suite against the
// nats-server at IDEM_TEST_NATS_URL (Debian's, started by scripts/services).
func TestConformanceExternal(t *testing.T) {
	t.Parallel()
	conn := external(t)
	brokertest.Run(t, brokertest.Harness{New: func(t *testing.T) brokertest.Broker { return newNATSBroker(t, conn) }})
}

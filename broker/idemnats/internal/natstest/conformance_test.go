package natstest

import (
	"testing"

	"github.com/idem-go/idem/broker/brokertest"
)

// TestConformanceInProcess runs the broker conformance suite and the outbox
// case against an in-process JetStream server.
func TestConformanceInProcess(t *testing.T) {
	t.Parallel()
	conn := inProcess(t)
	h := brokertest.Harness{New: func(t *testing.T) brokertest.Broker { return newNATSBroker(t, conn) }}
	brokertest.Run(t, h)
	brokertest.RunOutbox(t, h)
}

// TestConformanceExternal runs the broker conformance suite and the outbox case
// against the nats-server at IDEM_TEST_NATS_URL (Debian's, started by scripts/services).
func TestConformanceExternal(t *testing.T) {
	t.Parallel()
	conn := external(t)
	h := brokertest.Harness{New: func(t *testing.T) brokertest.Broker { return newNATSBroker(t, conn) }}
	brokertest.Run(t, h)
	brokertest.RunOutbox(t, h)
}

package natstest

import (
	"testing"
	"time"

	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/internal/ownservice"
)

// TestRelayAcrossServerKill: brokertest.RunRelayAcrossKill on a
// nats-server of the test's own (scripts/services, Debian's nats-server
// with JetStream), SIGKILLed twice under the relay and started again on
// the same store; the publisher's connection reconnects on its own.
func TestRelayAcrossServerKill(t *testing.T) {
	t.Parallel()
	svc := ownservice.Start(t, "nats")
	brokertest.RunRelayAcrossKill(t, newNATSBroker(t, reconnecting(svc.URL, 20*time.Millisecond)), svc)
}

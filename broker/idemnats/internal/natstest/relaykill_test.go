package natstest

import (
	"testing"
	"time"

	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/internal/ownservice"
	"github.com/nats-io/nats.go"
)

// TestRelayAcrossServerKill: brokertest.RunRelayAcrossKill on a
// nats-server of the test's own (scripts/services, Debian's nats-server
// with JetStream), SIGKILLed twice under the relay and started again on
// the same store; the publisher's connection reconnects on its own.
func TestRelayAcrossServerKill(t *testing.T) {
	t.Parallel()
	svc := ownservice.Start(t, "nats")
	conn := func(t testing.TB) *nats.Conn {
		t.Helper()
		nc, err := nats.Connect(svc.URL, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond),
			nats.ReconnectJitter(0, 0), nats.Timeout(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	brokertest.RunRelayAcrossKill(t, newNATSBroker(t, conn), svc)
}

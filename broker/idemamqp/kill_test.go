package idemamqp_test

import (
	"testing"

	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/internal/ownservice"
)

// TestRelayAcrossBrokerKill: brokertest.RunRelayAcrossKill on a RabbitMQ
// node of the test's own (scripts/services, Debian's rabbitmq-server),
// SIGKILLed twice under the relay and started again on the same state:
// confirmed persistent messages in a durable queue survive, and the
// publisher redials (ProducerConfig.Redial).
func TestRelayAcrossBrokerKill(t *testing.T) {
	t.Parallel()
	svc := ownservice.Start(t, "rabbitmq")
	b := newAMQPBrokerAt(t, svc.URL)
	// RabbitMQ may lose a queue declared just before a kill -9 (seen once
	// in 7 runs: the dead-letter queue gone after the restart). A
	// graceful stop and start first puts the declarations on disk.
	if err := svc.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := svc.Restart(); err != nil {
		t.Fatal(err)
	}
	brokertest.RunRelayAcrossKill(t, b, svc)
}

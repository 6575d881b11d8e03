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
	brokertest.RunRelayAcrossKill(t, newAMQPBrokerAt(t, svc.URL), svc)
}

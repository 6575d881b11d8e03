package idemamqp_test

import (
	"testing"

	"github.com/idem-go/idem/broker/brokertest"
)

// TestConformance runs the shared broker suite and the outbox case against
// the test RabbitMQ:
// a crash cuts the member's TCP connection, and RabbitMQ requeues what the
// member had not acked.
func TestConformance(t *testing.T) {
	t.Parallel()
	testURL(t)
	h := brokertest.Harness{New: newAMQPBroker}
	brokertest.Run(t, h)
	brokertest.RunOutbox(t, h)
}

package idemredisstream_test

import (
	"testing"

	"github.com/idem-go/idem/broker/brokertest"
)

// TestConformance runs the shared broker suite and the outbox case against the test Redis: a
// crash closes the member's client, and another member reclaims its pending
// entries with XAUTOCLAIM after MinIdle (StartOptions.Redelivery).
func TestConformance(t *testing.T) {
	t.Parallel()
	testURL(t)
	h := brokertest.Harness{New: newStreamBroker}
	brokertest.Run(t, h)
	brokertest.RunOutbox(t, h)
}

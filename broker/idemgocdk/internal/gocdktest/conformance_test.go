package gocdktest

import (
	"testing"
	"time"

	"github.com/idem-go/idem/broker/brokertest"
)

// TestConformanceMem runs the broker conformance suite on mempubsub, with
// a 1s ack deadline (brokertest's usual Redelivery): a crash cuts the
// member off, and the subscription redelivers what it had not acked once
// the deadline lapses.
func TestConformanceMem(t *testing.T) {
	t.Parallel()
	brokertest.Run(t, brokertest.Harness{New: func(t *testing.T) brokertest.Broker {
		return newCDKBroker(t, memChannel(t, time.Second))
	}})
}

// TestConformancePubSub runs the broker conformance suite on Google Cloud
// Pub/Sub through its in-process fake (pstest) and the Go CDK's gcppubsub
// driver, with a 1s ack deadline: a crash closes the member's connection,
// and the fake redelivers what it had not acked once the deadline lapses.
func TestConformancePubSub(t *testing.T) {
	t.Parallel()
	fake := newPubsubFake(t)
	brokertest.Run(t, brokertest.Harness{New: func(t *testing.T) brokertest.Broker {
		return newCDKBroker(t, fake.channel(t, time.Second))
	}})
}

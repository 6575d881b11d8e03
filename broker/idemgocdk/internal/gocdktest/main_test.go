package gocdktest

import (
	"os"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/pstest"

	"github.com/idem-go/idem/internal/leakcheck"
)

// TestMain fails the run if a test leaves a goroutine behind (a Consumer
// loop, a worker, a timer, a subscription's batcher) once the tests are
// over.
//
// It also lets the Pub/Sub fake take ack deadlines of 1s (the service's
// minimum is 10s), so that redeliveries come within the suite's waits.
func TestMain(m *testing.M) {
	pstest.SetMinAckDeadline(time.Second)
	os.Exit(leakcheck.Run(m))
}

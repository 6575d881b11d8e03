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
//
// One goroutine of Go CDK's own is not counted: the one
// pubsub.Subscription.Receive starts to fetch the next batch in the
// background (gocloud.dev v0.49.0, pubsub.go:558) signals the batch's
// arrival on an unbuffered channel that only a later Receive reads, so
// when the reader has stopped calling Receive (its context ended, as
// every consumer's does at the end of a test) it blocks for good, and
// Shutdown does not end it. The adapter cannot reach it; a clean-clone run
// failed on it once with every test passed.
func TestMain(m *testing.M) {
	pstest.SetMinAckDeadline(time.Second)
	os.Exit(leakcheck.Run(m, "gocloud.dev/pubsub.(*Subscription).Receive.func2"))
}

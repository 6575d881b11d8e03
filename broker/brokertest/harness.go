package brokertest

import (
	"context"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// Harness tells [Run] how to drive one broker adapter against a real broker.
type Harness struct {
	// New returns a fresh, isolated Broker (its own stream, topic, queue or
	// key names and its own dead letter), registering its cleanup with
	// t.Cleanup. Every case calls it from its own parallel subtest, so it
	// must be safe for concurrent use.
	New func(t *testing.T) Broker
}

// Broker is one isolated channel of a broker (a JetStream stream and
// consumer, a Kafka topic and consumer group, a RabbitMQ queue, a Redis
// stream and consumer group) seen through the adapter under test.
type Broker interface {
	// Publish publishes one message with the given message ID through the
	// adapter's producer helper, and returns once the broker has it. An
	// empty id publishes a message that carries no message ID at all (the
	// header, property or field is absent), bypassing the helper's default
	// ID; the adapter must dead-letter it.
	Publish(ctx context.Context, id string, payload []byte) error
	// Start starts one consumer instance (one member of the consumer
	// group) that runs every delivery through p and maps the Outcome to
	// the broker as DESIGN.md section 4 says. It returns once the member
	// is consuming (for Kafka: has joined the group). Members started on
	// one Broker share the work as a consumer group does.
	Start(ctx context.Context, p idem.Processor, opts StartOptions) (Member, error)
	// DeadLetters returns every message in this Broker's dead letter so
	// far, in any order, without consuming them destructively (a second
	// call returns them again, plus any new ones).
	DeadLetters(ctx context.Context) ([]DeadLetter, error)
}

// BatchBroker is a Broker whose adapter also has a batch mode, driven by an
// idem.BatchProcessor (Kafka: one transaction per fetched batch).
type BatchBroker interface {
	Broker
	// StartBatch is Start in batch mode, with at most opts.BatchSize
	// messages per ProcessBatch call.
	StartBatch(ctx context.Context, p idem.BatchProcessor, opts StartOptions) (Member, error)
}

// Member is one running consumer instance.
type Member interface {
	// Stop stops the member gracefully: it takes no new deliveries,
	// finishes the ones in flight, acknowledges (or commits offsets for)
	// what finished, and returns when all of that is done or ctx ends.
	Stop(ctx context.Context) error
	// Crash stops the member as a killed process would: it returns at once
	// without waiting for handlers in flight, and from then on no ack, nak
	// or offset commit of this member reaches the broker (close the
	// connection or client; a Kafka member leaves without committing). The
	// broker redelivers what this member had not acknowledged, after its
	// own timeout (Redelivery).
	Crash()
}

// StartOptions configures one member.
type StartOptions struct {
	// Concurrency is how many deliveries the member processes at once; at
	// least 1.
	Concurrency int
	// Redelivery is the broker's timeout for redelivering a message whose
	// consumer neither acknowledged nor refused it (JetStream AckWait, the
	// XAUTOCLAIM min-idle time). Brokers that redeliver on connection loss
	// (RabbitMQ, Kafka rebalances) may ignore it. The suite uses short
	// values (around 1s), so set the adapter's retry delays below it.
	Redelivery time.Duration
	// BatchSize is the most messages per batch in StartBatch.
	BatchSize int
}

// DeadLetter is one message found in a dead letter.
type DeadLetter struct {
	// ID is the message ID the message carried; empty if it had none.
	ID string
	// Payload is the original payload, byte for byte.
	Payload []byte
	// Reason is the reason the adapter gave (the Outcome's error text).
	// It is never empty.
	Reason string
}

// PublishDeduper is implemented by a Broker whose broker itself drops a
// publish that repeats a message ID within a window, as JetStream does for
// Nats-Msg-Id within the stream's duplicate window (StreamConfig.Duplicates).
// The suite then does not expect a Duplicate outcome for a repeat published
// inside the window, and waits the window out before publishing a repeat
// that must reach the consumer (a late duplicate, a fingerprint mismatch).
// Brokers without such a window do not implement it. This interface is an
// optional addition to the Broker contract.
type PublishDeduper interface {
	// DedupeWindow is the broker's duplicate window; keep it short in
	// tests (JetStream's minimum is 100ms).
	DedupeWindow() time.Duration
}

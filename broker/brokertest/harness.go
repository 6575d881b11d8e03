package brokertest

import (
	"context"
	"errors"
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
	// ID; the adapter must dead-letter it. An id the broker cannot carry
	// in its place for IDs at all (RabbitMQ's message_id property holds at
	// most 255 bytes) returns an error matching ErrNotCarried, and the
	// suite leaves that message out.
	Publish(ctx context.Context, id string, payload []byte) error
	// Start starts one consumer instance (one member of the consumer
	// group) that runs every delivery through p (idem.Guard) and carries
	// out what idem.Outcome.Settle decides. It returns once the member is
	// consuming (for Kafka: has joined the group). Members started on one
	// Broker share the work as a consumer group does.
	Start(ctx context.Context, p idem.Processor, opts StartOptions) (Member, error)
	// NewConsumer returns one member that is not running yet: the
	// adapter's Consumer as an application gets it, configured as Start
	// configures one (the Processor p, opts, the same retry delays). The
	// suite calls its Run and Stop itself, to check the lifecycle every
	// adapter promises (see Runner). What it needs (a client, a
	// connection) is released by t.Cleanup, or when Run returns if the
	// application would release it then (a Kafka client leaves its group).
	NewConsumer(p idem.Processor, opts StartOptions) (Runner, error)
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

// Runner is an adapter's Consumer as the application drives it. Every
// adapter's Consumer promises the same lifecycle, which the suite checks:
//
//   - Run consumes until Stop is called or ctx ends. It returns nil after
//     Stop, and ctx.Err() (so errors.Is(err, context.Canceled)) when ctx
//     ended first; the handlers in flight then see their context
//     cancelled and nothing they did not finish is acknowledged.
//   - A Consumer runs once: a second Run, while the first runs or after it
//     returned, returns an error matching idem.ErrAlreadyRunning at once.
//   - Stop before Run makes Run return nil at once; Stop is safe to call
//     more than once and concurrently, and returns nil once Run has
//     returned (or ctx's error if ctx ends first).
//   - Once Run has returned, no goroutine it started is left.
type Runner interface {
	Run(ctx context.Context) error
	Stop(ctx context.Context) error
}

// ErrNotCarried is what Broker.Publish returns (wrapped or not) for a
// message ID that the broker cannot carry in its place for IDs at all.
var ErrNotCarried = errors.New("brokertest: the broker cannot carry this message ID")

// ErrDeduped is what Broker.Publish of a [PublishDeduper] returns (wrapped
// or not) when the broker dropped the message as a repeat of an ID it
// still remembers (JetStream's PubAck.Duplicate). The suite takes it as a
// publish that went through, except for a repeat that must reach the
// consumer, which it publishes again until the broker stores it.
var ErrDeduped = errors.New("brokertest: the broker dropped this message as a repeat within its duplicate window")

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
	// Prefetch is the most deliveries the member may hold at once, running
	// or waiting for a free handler (JetStream MaxMessages, the AMQP
	// prefetch count, Kafka's records per poll); 0 leaves the adapter's
	// default. An adapter that never reads more than its free handlers can
	// start (Redis Streams) ignores it. The suite sets it well above
	// Concurrency to check that deliveries waiting their turn do not
	// outlive the broker's ack deadline.
	Prefetch int
	// HandlerTimeout, when positive, is the adapter's bound on one
	// delivery's processing (its Config.HandlerTimeout): the context the
	// Processor gets ends that long after the delivery started. Zero
	// leaves the adapter's default.
	HandlerTimeout time.Duration
}

// DeadLetter is one message found in a dead letter.
type DeadLetter struct {
	// ID is the message ID the message carried; empty if it had none.
	ID string
	// Payload is the original payload, byte for byte.
	Payload []byte
	// Reason is the idem.HeaderDeadLetterReason header (or field) the
	// adapter wrote: the Settlement's reason word, e.g.
	// "invalid-message-id". It is never empty.
	Reason string
	// Error is the idem.HeaderDeadLetterError header (or field): the
	// Outcome's error text. It is never empty.
	Error string
}

// PayloadLimiter is implemented by a Broker whose broker refuses payloads
// of a mebibyte (NATS's max_payload is 1 MiB including headers, a Kafka
// producer batch about 1 MB). PayloadLimit is the largest payload the
// suite may publish, leaving room for the headers the adapter adds to a
// dead letter. Brokers without such a limit do not implement it; the
// suite then uses 1 MiB.
type PayloadLimiter interface {
	PayloadLimit() int
}

// PublishDeduper is implemented by a Broker whose broker itself drops a
// publish that repeats a message ID within a window, as JetStream does for
// Nats-Msg-Id within the stream's duplicate window (StreamConfig.Duplicates).
// The suite then does not expect a Duplicate outcome for a repeat published
// inside the window. Its Publish returns an error matching [ErrDeduped] for
// a publish the broker dropped: a repeat that must reach the consumer (a
// late duplicate, a fingerprint mismatch) is published again until the
// broker takes it, since a broker forgets an ID some time after the window
// (JetStream purges its IDs on a timer, late on a loaded machine).
// Brokers without such a window do not implement it. This interface is an
// optional addition to the Broker contract.
type PublishDeduper interface {
	// DedupeWindow is the broker's duplicate window; keep it short in
	// tests (JetStream's minimum is 100ms).
	DedupeWindow() time.Duration
}

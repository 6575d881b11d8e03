package main

import (
	"context"
	"errors"
	"time"

	"github.com/idem-go/idem"
)

// A broker is one in-process broker shared by every run of the harness: an
// embedded JetStream server or a kfake cluster. Each run gets its own channel
// on it (a stream or a topic), so runs cannot see each other's messages.
type broker interface {
	// name is "nats" or "kafka", as given to --brokers.
	name() string
	// newChannel creates an isolated channel for one run. ackWait is how
	// long JetStream waits for an ack before redelivering (Kafka ignores
	// it: it replays uncommitted records to the next member instead).
	newChannel(ctx context.Context, tag string, ackWait time.Duration) (channel, error)
	close()
}

// A channel is a stream and durable consumer (JetStream) or a topic and
// consumer group (Kafka) used by one run.
type channel interface {
	// publish publishes payload with the producer's message ID id where the
	// broker carries it (Nats-Msg-Id, a "message-id" record header). It
	// reports dropped when the broker refused the publish as a duplicate
	// (JetStream's publish dedupe window).
	publish(ctx context.Context, id string, payload []byte) (dropped bool, err error)
	// member starts one consumer instance (one group member).
	member(ctx context.Context) (member, error)
	// settled reports whether every published message has been
	// acknowledged (JetStream: nothing pending or awaiting an ack; Kafka:
	// the group's committed offsets are at the end of every partition).
	settled(ctx context.Context) (bool, error)
	// retryInPlace is true when a delivery that must be retried is retried
	// by the consumer before it moves on (Kafka, which has no per-record
	// redelivery), and false when the broker redelivers it (JetStream's
	// NakWithDelay).
	retryInPlace() bool
	// outgoing creates the run's destination for outbox messages (a
	// stream capturing one subject, a topic), deleted by close, and
	// returns its name as an OutgoingMessage.Destination, the relay's
	// publisher for it (idemnats, idemkafka), and a count of the
	// messages it holds (JetStream drops a re-send of an ID inside its
	// duplicate window; Kafka keeps every copy).
	outgoing(ctx context.Context) (dest string, pub idem.Publisher, held func(context.Context) (int, error), err error)
	close()
}

// A member is one consumer instance. fetch is called from one goroutine,
// commit from another; the deliveries' ack and nak from others.
type member interface {
	// fetch returns up to max deliveries that are available now (Kafka:
	// waiting up to about a second for some); none when nothing came.
	fetch(ctx context.Context, max int) ([]delivery, error)
	// commit is called with the deliveries of one fetch, in fetch order,
	// once every one of them was settled (acked or nacked): Kafka commits
	// their offsets there; JetStream has nothing to do.
	commit(ctx context.Context, ds []delivery) error
	// crash abandons the member as a killed process would: nothing it had
	// not acknowledged (or committed) yet is, and its connection is closed.
	crash()
	// stop closes the member gracefully.
	stop(ctx context.Context)
}

// delivery is one delivery of a message.
type delivery struct {
	id      string
	payload []byte
	// ack tells the broker the delivery is done.
	ack func() error
	// nak asks for a redelivery after delay (JetStream); nil when the
	// channel retries in place.
	nak func(delay time.Duration) error
	// rec is the broker's own record, for commit (Kafka).
	rec any
}

// errCrashed is returned by a member's methods after crash.
var errCrashed = errors.New("bench: member crashed")

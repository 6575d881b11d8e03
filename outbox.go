package idem

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"sync"

	"github.com/idem-go/idem/idemdriver"
)

// ErrInvalidOutgoing means an outgoing message breaks the outbox rules
// (empty or over-long destination or name, control characters, a name
// emitted twice by one processing). It is idemdriver.ErrInvalidOutgoing.
var ErrInvalidOutgoing = idemdriver.ErrInvalidOutgoing

// ErrNoOutbox means Emit was called where it cannot write to an outbox:
// outside a transactional Consumer's handler, after the handler returned,
// for a message that is not one of the handler's, or with a store that
// does not implement idemdriver.OutboxTx. A configuration or programming
// error.
var ErrNoOutbox = fmt.Errorf("%w: no outbox here", ErrInvalidConfig)

// OutgoingMessage is a message a handler emits through the outbox (see
// [Emit]). It is written to the store's outbox table in the handler's
// transaction and sent by a [Relay] after commit.
type OutgoingMessage struct {
	// Name identifies the message within the processing of its incoming
	// message ("charged", "receipt"). The outgoing ID is derived from the
	// consumer name, the incoming message ID and Name (see [OutgoingID]),
	// so a processing that runs again after a rollback emits the same IDs.
	// Empty means the emission's sequence number within the processing
	// (1, 2, ...), which is stable only if the handler emits in the same
	// order every time. At most 255 bytes.
	Name string
	// Destination is where the message goes, as the relay's Publisher
	// reads it (a NATS subject, a Kafka topic, an AMQP exchange or queue,
	// a Redis stream). Mandatory, 1 to 255 bytes of text.
	Destination string
	// Key is the ordering key: messages with one Destination and one
	// non-empty Key are sent in the order they were emitted (the order of
	// the outbox rows' sequence), each after the previous one was
	// confirmed. Messages with an empty Key are not ordered. Kafka
	// publishers use it as the record key. At most 255 bytes.
	Key string
	// Payload is the message body.
	Payload []byte
	// Headers are extra message headers. The publisher sets the message ID
	// header itself.
	Headers map[string]string
}

// Outgoing is one outbox row as the relay hands it to a [Publisher]: the
// message with its ID, ordering key and headers, and where it came from.
type Outgoing = idemdriver.OutgoingRecord

// Publisher sends outbox messages to a broker for a [Relay].
//
// Publish sends msgs and returns one error per message, in order (a slice
// of another length fails the whole batch, as retryable). A nil error
// means the broker has durably accepted the message (a JetStream PubAck, a
// Kafka produce acknowledged by the required replicas, a RabbitMQ
// publisher confirm, an XADD reply): the relay then deletes the row (or
// marks it sent, with RelayConfig.KeepSent) and never sends it again, so
// a publisher must not report success before that. An error matching
// [ErrPermanent] (wrap it with [Permanent]) means the message can never be
// sent as it is; the row is marked failed and no longer holds back its
// key. Any other error is retried with backoff, and later messages of the
// same destination and key wait for it.
//
// Each message's ID must travel where the destination's idem consumer
// adapter reads the message ID (NATS: the Nats-Msg-Id header, which also
// enables JetStream's duplicate window; Kafka: the message-id header, or
// the adapter's configured one; RabbitMQ: the message_id property; Redis
// Streams: the message-id field), because a message may be sent more than
// once (a crash between the broker's confirmation and the relay's mark)
// and the downstream consumer deduplicates it by that ID.
//
// A batch holds at most one message per destination and non-empty
// ordering key, so a publisher may send the whole batch concurrently
// (asynchronous publishes, then wait for every confirmation) without
// breaking order. ctx bounds the call (it ends before the rows' lease
// does); Publish must return when it ends, failing the messages not yet
// confirmed. Publish must be safe for concurrent use when several Relays
// share one Publisher.
type Publisher interface {
	Publish(ctx context.Context, msgs []Outgoing) []error
}

// PublisherFunc adapts a function to a [Publisher].
type PublisherFunc func(ctx context.Context, msgs []Outgoing) []error

// Publish calls f.
func (f PublisherFunc) Publish(ctx context.Context, msgs []Outgoing) []error { return f(ctx, msgs) }

// OutgoingID returns the ID of the outgoing message that consumer emits
// while processing the incoming message messageID, under name; an empty
// name stands for the seq-th emission of that processing (1-based). It is
// [DeriveKey] with a step that names the outbox, so it is stable across
// redeliveries, processes and versions of idem, distinct from the keys of
// external calls, and a valid message ID (69 ASCII bytes). Services that
// write outbox rows themselves may use any unique ID instead.
func OutgoingID(consumer, messageID, name string, seq int) string {
	if name != "" {
		return DeriveKey(consumer, messageID, "outbox:name:"+name)
	}
	return DeriveKey(consumer, messageID, "outbox:seq:"+strconv.Itoa(seq))
}

// Emit emits m through the outbox while a transactional [Consumer]'s
// handler processes one message (Process or ProcessTx): ctx must be, or
// derive from, the context the handler was given. The message is written
// to the outbox table in the handler's transaction after the handler
// returns successfully, so it commits with the claim and the effects or
// not at all: a handler error or panic emits nothing. After commit the
// Consumer wakes its Config.Relay, if any, which sends it.
// Config.OutboxHeaders, if set, first adds headers from ctx to m (the
// trace context of the handler's span, with idemotel.InjectTraceContext).
//
// It returns the outgoing ID ([OutgoingID]). Errors: [ErrNoOutbox] when
// ctx has no outbox (not in a handler, a batch handler (use [EmitFor]),
// after the handler returned, or a store without the outbox capability);
// [ErrInvalidOutgoing] for an invalid m or a Name (or ID) emitted twice by
// one processing. Emit is safe to call from goroutines the handler starts
// and waits for.
func Emit(ctx context.Context, m OutgoingMessage) (string, error) {
	e, _ := ctx.Value(emitterKey{}).(*emitter)
	if e == nil {
		return "", fmt.Errorf("%w: Emit outside a transactional consumer's handler", ErrNoOutbox)
	}
	if e.ok && e.single == "" {
		return "", fmt.Errorf("%w: Emit in a batch handler (use EmitFor)", ErrNoOutbox)
	}
	return e.emit(ctx, e.single, m)
}

// EmitFor is [Emit] for the message sourceID of the batch a
// [BatchHandler] processes (or of the one message a Handler processes):
// the outgoing ID is derived from sourceID. sourceID must be one of the
// messages the handler was given, else the error matches [ErrNoOutbox].
func EmitFor(ctx context.Context, sourceID string, m OutgoingMessage) (string, error) {
	e, _ := ctx.Value(emitterKey{}).(*emitter)
	if e == nil {
		return "", fmt.Errorf("%w: EmitFor outside a transactional consumer's handler", ErrNoOutbox)
	}
	return e.emit(ctx, sourceID, m)
}

type emitterKey struct{}

// emitter collects the rows a handler emits, for one transaction.
type emitter struct {
	consumer string
	single   string         // the message of Process/ProcessTx; "" in a batch
	ok       bool           // the store can write them
	inject   HeaderInjector // Config.OutboxHeaders; nil adds nothing

	n   int            // emissions so far of single
	seq map[string]int // batch: source ID -> emissions so far; its keys are the allowed sources

	mu     sync.Mutex
	closed bool
	ids    map[string]struct{}
	rows   []idemdriver.OutgoingRecord
}

func newEmitter(consumer string, ok bool, sources ...string) *emitter {
	e := &emitter{consumer: consumer, ok: ok}
	if len(sources) == 1 {
		e.single = sources[0]
		return e
	}
	e.seq = make(map[string]int, len(sources))
	for _, s := range sources {
		e.seq[s] = 0
	}
	return e
}

func (e *emitter) emit(ctx context.Context, source string, m OutgoingMessage) (string, error) {
	if !e.ok {
		return "", fmt.Errorf("%w: the store does not implement idemdriver.OutboxTx", ErrNoOutbox)
	}
	if e.inject != nil {
		h := make(map[string]string, len(m.Headers)+2)
		maps.Copy(h, m.Headers)
		e.inject(ctx, func(k, v string) { h[k] = v })
		if len(h) > 0 {
			m.Headers = h
		}
	}
	if len(m.Name) > idemdriver.MaxStepNameLength {
		return "", fmt.Errorf("%w: name of %d bytes, over %d", ErrInvalidOutgoing, len(m.Name), idemdriver.MaxStepNameLength)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return "", fmt.Errorf("%w: Emit after the handler returned", ErrNoOutbox)
	}
	n, ok := e.n, source == e.single && e.single != ""
	if !ok {
		n, ok = e.seq[source]
	}
	if !ok {
		return "", fmt.Errorf("%w: message %q is not one this handler processes", ErrNoOutbox, source)
	}
	n++
	id := OutgoingID(e.consumer, source, m.Name, n)
	r := idemdriver.OutgoingRecord{
		ID: id, Consumer: e.consumer, SourceID: source,
		Destination: m.Destination, Key: m.Key, Payload: m.Payload, Headers: m.Headers,
	}
	if err := idemdriver.ValidateOutgoing(&r); err != nil {
		return "", err
	}
	if _, dup := e.ids[id]; dup {
		return "", fmt.Errorf("%w: %q emitted twice for message %q", ErrInvalidOutgoing, m.Name, source)
	}
	if e.ids == nil {
		e.ids = map[string]struct{}{}
	}
	e.ids[id] = struct{}{}
	if source == e.single {
		e.n = n
	} else {
		e.seq[source] = n
	}
	e.rows = append(e.rows, r)
	return id, nil
}

// take closes the emitter and returns what was emitted.
func (e *emitter) take() []idemdriver.OutgoingRecord {
	if e == nil {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	return e.rows
}

// emitterCtx is the context a Process handler gets: the caller's, carrying
// the emitter as context.WithValue(ctx, emitterKey{}, e) would, but held
// in what Process allocates for the message anyway.
type emitterCtx struct {
	context.Context
	e *emitter
}

// Value implements context.Context.
func (c *emitterCtx) Value(key any) any {
	if key == (emitterKey{}) {
		return c.e
	}
	return c.Context.Value(key)
}

// withEmitter returns ctx carrying e (nil: ctx as it is).
func withEmitter(ctx context.Context, e *emitter) context.Context {
	if e == nil {
		return ctx
	}
	return context.WithValue(ctx, emitterKey{}, e)
}

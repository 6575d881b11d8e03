package idem

import (
	"context"
	"fmt"
)

// Delivery is what a broker adapter knows about a delivery that the core
// does not: the broker, where the message came from, and the message's
// headers. An adapter puts it in the context it passes to [Guard] or
// [GuardBatch] ([WithDelivery]); hooks read it back
// ([DeliveryFromContext]), which is how an observability hook (package
// idemotel) names the process span after its destination, sets
// messaging.system, and continues the producer's trace from the headers,
// without the core or the adapters depending on a tracing library.
type Delivery struct {
	// System names the broker, as the OpenTelemetry messaging conventions
	// spell messaging.system: "nats", "kafka", "rabbitmq", "redis".
	System string
	// Destination is where the message was consumed from: the NATS
	// subject, the Kafka topic, the RabbitMQ queue, the Redis stream key.
	Destination string
	// DestinationTemplate is a low-cardinality form of Destination, set
	// when Destination may name one entity per message (a NATS subject
	// such as "orders.42"): the JetStream consumer's filter subject
	// ("orders.*") or its stream's name. Metrics use it instead of
	// Destination.
	DestinationTemplate string
	// ConsumerGroup is the broker's own consumer group when there is one
	// (a Kafka group ID, a Redis Streams group, a JetStream consumer
	// name); empty when the broker has none (a RabbitMQ queue).
	ConsumerGroup string
	// Header gives read access to the message's headers (Redis Streams:
	// the entry's fields); nil when the delivery is a batch or has none.
	Header HeaderCarrier
	// BatchHeaders holds, for a batch (GuardBatch), the headers of each
	// message in the batch's order; nil for a single delivery.
	BatchHeaders []HeaderCarrier
}

// HeaderCarrier reads a message's headers: the read half of a text-map
// carrier (the shape of OpenTelemetry's propagation.TextMapCarrier).
type HeaderCarrier interface {
	// Get returns the first value of the header key, "" when absent.
	Get(key string) string
	// Keys returns the names of the headers present.
	Keys() []string
}

// HeaderInjector writes headers onto an outgoing message from ctx, the
// publishing call's context: a producer calls it once per Publish, after
// its own headers, with set writing one header (replacing a header of the
// same name). Package idemotel's InjectTraceContext is one: it writes the
// W3C traceparent and tracestate of the span in ctx. It must not write
// the producer's message ID header.
type HeaderInjector func(ctx context.Context, set func(key, value string))

// Headers are a message's headers by name, values in the broker's order:
// the type of [Message.Headers]. It is a [HeaderCarrier], so a hook reads
// a delivery's headers (Delivery.Header) from the same map the adapter put
// in the Message.
type Headers map[string][]string

// Get returns the first value of key, "" when absent. Names are matched
// exactly, as the broker carried them.
func (h Headers) Get(key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// Keys returns the names in h, in no particular order.
func (h Headers) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}

type deliveryKey struct{}

// WithDelivery returns a copy of ctx carrying d, for the hooks of the
// Process call made with it.
func WithDelivery(ctx context.Context, d Delivery) context.Context {
	return &deliveryCtx{Context: ctx, d: d}
}

// DeliveryFromContext returns the Delivery an adapter put in ctx with
// WithDelivery, and whether there was one (a direct Process call has none).
func DeliveryFromContext(ctx context.Context) (Delivery, bool) {
	if d, ok := ctx.Value(deliveryKey{}).(*Delivery); ok {
		return *d, true
	}
	return Delivery{}, false
}

// deliveryCtx is the context WithDelivery makes: ctx's, and d under
// deliveryKey, in one allocation (context.WithValue would box d in a
// second one). Value gives a pointer to d, which DeliveryFromContext
// copies: nothing else can ask for deliveryKey. A context derived from it
// registers with ctx's cancellation as through context.WithValue's
// (Done and the context package's own keys are ctx's).
type deliveryCtx struct {
	context.Context
	d Delivery
}

// Value implements context.Context.
func (c *deliveryCtx) Value(key any) any {
	if _, ok := key.(deliveryKey); ok {
		return &c.d
	}
	return c.Context.Value(key)
}

// String names the context as context.WithValue's do.
func (c *deliveryCtx) String() string {
	if s, ok := c.Context.(fmt.Stringer); ok {
		return s.String() + ".WithDelivery"
	}
	return "context.WithDelivery"
}

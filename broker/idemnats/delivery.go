package idemnats

import (
	"context"

	"github.com/idem-go/idem"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// System is the messaging.system this adapter reports in the idem.Delivery
// of each message (the OpenTelemetry messaging conventions' name for NATS).
const System = "nats"

// withDelivery returns ctx carrying the idem.Delivery of m: system nats,
// the message's subject, as a template the JetStream consumer's filter
// subject when it has exactly one (else its stream's name), the JetStream
// consumer's name as the consumer group, and the headers.
func (c *Consumer) withDelivery(ctx context.Context, m jetstream.Msg) context.Context {
	return idem.WithDelivery(ctx, c.delivery(m, idem.Headers(m.Headers())))
}

// withBatchDelivery returns ctx carrying the idem.Delivery of the batch
// ms (msgs, their idem.Messages, in the same order): as withDelivery's
// of its first message, but with the headers of each message in
// BatchHeaders and no Header, as idem.Delivery describes a batch (one
// message: withDelivery's).
func (c *Consumer) withBatchDelivery(ctx context.Context, ms []jetstream.Msg, msgs []idem.Message) context.Context {
	if len(ms) == 1 {
		return c.withDelivery(ctx, ms[0])
	}
	d := c.delivery(ms[0], nil)
	d.BatchHeaders = make([]idem.HeaderCarrier, len(msgs))
	for i, m := range msgs {
		if m.Headers != nil {
			d.BatchHeaders[i] = m.Headers
		}
	}
	return idem.WithDelivery(ctx, d)
}

// delivery is the idem.Delivery of m with header h (a nil h: none).
func (c *Consumer) delivery(m jetstream.Msg, h idem.Headers) idem.Delivery {
	d := idem.Delivery{System: System, Destination: m.Subject()}
	if h != nil {
		d.Header = h
	}
	if info := c.cons.CachedInfo(); info != nil {
		names := c.names.Load()
		if names == nil || names.info != info {
			// The consumer's info was fetched again: its names, once
			// for every message until the next time.
			names = &consumerNames{info: info, group: info.Name, template: info.Stream}
			if f := consumerFilters(info); len(f) == 1 {
				names.template = f[0]
			}
			c.names.Store(names)
		}
		d.ConsumerGroup, d.DestinationTemplate = names.group, names.template
	}
	return d
}

// consumerNames is what withDelivery takes from one ConsumerInfo of the
// JetStream consumer (the one CachedInfo returned): the consumer group
// and the destination template.
type consumerNames struct {
	info            *jetstream.ConsumerInfo
	group, template string
}

// WithHeaderInjector makes the Producer call inject on every Publish, to
// add headers from the publishing context (idemotel.InjectTraceContext
// writes the W3C trace context, so the consumer's process span continues
// the producer's trace). It never replaces Nats-Msg-Id or the ID header.
func WithHeaderInjector(inject idem.HeaderInjector) ProducerOption {
	return func(p *Producer) { p.inject = inject }
}

// injectHeaders calls the Producer's HeaderInjector, if any, on msg.
func (p *Producer) injectHeaders(ctx context.Context, msg *nats.Msg) {
	if p.inject == nil {
		return
	}
	p.inject(ctx, func(k, v string) {
		if k != jetstream.MsgIDHeader && k != p.idHeader {
			msg.Header.Set(k, v)
		}
	})
}

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
	d := idem.Delivery{System: System, Destination: m.Subject(), Header: idem.Headers(m.Headers())}
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
	return idem.WithDelivery(ctx, d)
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

package idemredisstream

import (
	"context"
	"maps"

	"github.com/idem-go/idem"
)

// System is the messaging.system this adapter reports in the idem.Delivery
// of each entry.
const System = "redis"

// withDelivery returns ctx carrying the idem.Delivery of an entry with
// headers h (its fields but the payload): system redis, the stream, the
// consumer group, and h.
func (c *Consumer) withDelivery(ctx context.Context, h idem.Headers) context.Context {
	d := idem.Delivery{System: System, Destination: c.cfg.Stream, ConsumerGroup: c.cfg.Group}
	if h != nil {
		d.Header = h
	}
	return idem.WithDelivery(ctx, d)
}

// withBatchDelivery is withDelivery for a batch: the idem.Delivery of
// msgs, each message's headers in BatchHeaders, in order.
func (c *Consumer) withBatchDelivery(ctx context.Context, msgs []idem.Message) context.Context {
	d := idem.Delivery{System: System, Destination: c.cfg.Stream, ConsumerGroup: c.cfg.Group,
		BatchHeaders: make([]idem.HeaderCarrier, len(msgs))}
	for i, m := range msgs {
		d.BatchHeaders[i] = m.Headers
	}
	return idem.WithDelivery(ctx, d)
}

// injectFields returns fields with those ProducerConfig.InjectHeaders
// writes added (a copy when it writes any), never the ID or payload field.
func (p *Producer) injectFields(ctx context.Context, fields map[string]string) map[string]string {
	if p.cfg.InjectHeaders == nil {
		return fields
	}
	out := maps.Clone(fields)
	p.cfg.InjectHeaders(ctx, func(k, v string) {
		if out == nil {
			out = map[string]string{}
		}
		out[k] = v
	})
	return out
}

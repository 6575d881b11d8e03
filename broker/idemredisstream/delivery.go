package idemredisstream

import (
	"context"
	"maps"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
)

// System is the messaging.system this adapter reports in the idem.Delivery
// of each entry.
const System = "redis"

// withDelivery returns ctx carrying the idem.Delivery of m: system redis,
// the stream, the consumer group, and the entry's fields as its headers.
func (c *Consumer) withDelivery(ctx context.Context, m redis.XMessage) context.Context {
	return idem.WithDelivery(ctx, idem.Delivery{System: System, Destination: c.cfg.Stream, ConsumerGroup: c.cfg.Group, Header: idem.AnyHeader(m.Values)})
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

package idemkafka

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
)

// System is the messaging.system this adapter reports in the idem.Delivery
// of each record (the OpenTelemetry messaging conventions' name for Kafka).
const System = "kafka"

// withDelivery returns ctx carrying the idem.Delivery of msgs, read from
// topic: system kafka, the topic, the client's consumer group, and the
// messages' headers (BatchHeaders for a batch).
func (c *Consumer) withDelivery(ctx context.Context, topic string, msgs []idem.Message) context.Context {
	group, _ := c.cl.OptValue(kgo.ConsumerGroup).(string)
	d := idem.Delivery{System: System, Destination: topic, ConsumerGroup: group}
	if len(msgs) == 1 {
		if msgs[0].Headers != nil {
			d.Header = msgs[0].Headers
		}
	} else {
		d.BatchHeaders = make([]idem.HeaderCarrier, len(msgs))
		for j, m := range msgs {
			d.BatchHeaders[j] = m.Headers
		}
	}
	return idem.WithDelivery(ctx, d)
}

// injectHeaders calls ProducerConfig.InjectHeaders, if set, on rec.
func (p *Producer) injectHeaders(ctx context.Context, rec *kgo.Record) {
	if p.cfg.InjectHeaders == nil {
		return
	}
	p.cfg.InjectHeaders(ctx, func(k, v string) {
		if k == p.cfg.IDHeader {
			return
		}
		for i := range rec.Headers {
			if rec.Headers[i].Key == k {
				rec.Headers[i].Value = []byte(v)
				return
			}
		}
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
	})
}

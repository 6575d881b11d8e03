package idemkafka

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
)

// System is the messaging.system this adapter reports in the idem.Delivery
// of each record (the OpenTelemetry messaging conventions' name for Kafka).
const System = "kafka"

// recordHeaders is an idem.HeaderCarrier over a record's headers.
type recordHeaders []kgo.RecordHeader

func (h recordHeaders) Get(key string) string {
	for _, rh := range h {
		if rh.Key == key {
			return string(rh.Value)
		}
	}
	return ""
}

func (h recordHeaders) Keys() []string {
	keys := make([]string, len(h))
	for i, rh := range h {
		keys[i] = rh.Key
	}
	return keys
}

// withDelivery returns ctx carrying the idem.Delivery of the records at
// idx in recs: system kafka, the topic, the client's consumer group, and
// the headers (BatchHeaders for a batch).
func (c *Consumer) withDelivery(ctx context.Context, recs []*kgo.Record, idx []int) context.Context {
	group, _ := c.cl.OptValue(kgo.ConsumerGroup).(string)
	d := idem.Delivery{System: System, Destination: recs[idx[0]].Topic, ConsumerGroup: group}
	if len(idx) == 1 {
		d.Header = recordHeaders(recs[idx[0]].Headers)
	} else {
		d.BatchHeaders = make([]idem.HeaderCarrier, len(idx))
		for j, i := range idx {
			d.BatchHeaders[j] = recordHeaders(recs[i].Headers)
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

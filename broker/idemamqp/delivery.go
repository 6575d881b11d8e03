package idemamqp

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
)

// System is the messaging.system this adapter reports in the idem.Delivery
// of each message (the OpenTelemetry messaging conventions' name for
// RabbitMQ).
const System = "rabbitmq"

// withDelivery returns ctx carrying the idem.Delivery of a delivery with
// headers h (deliveryHeaders): system
// rabbitmq, the queue consumed, no consumer group (a queue has none), and
// the headers.
func (c *Consumer) withDelivery(ctx context.Context, h idem.Headers) context.Context {
	d := idem.Delivery{System: System, Destination: c.cfg.Queue}
	if h != nil {
		d.Header = h
	}
	return idem.WithDelivery(ctx, d)
}

// injectHeaders calls ProducerConfig.InjectHeaders, if set, on msg.
func (p *Producer) injectHeaders(ctx context.Context, msg *amqp.Publishing) {
	if p.cfg.InjectHeaders == nil {
		return
	}
	p.cfg.InjectHeaders(ctx, func(k, v string) {
		if k == p.cfg.IDHeader {
			return
		}
		if msg.Headers == nil {
			msg.Headers = amqp.Table{}
		}
		msg.Headers[k] = v
	})
}

package idemcli

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The demo's RabbitMQ names. The message ID travels in the message_id property.
const (
	amqpQueue     = "idem-demo-payments"
	amqpDeadQueue = "idem-demo-payments-dead"
)

// amqpBroker carries the demo's messages on RabbitMQ: durable queues,
// persistent messages published with confirms, manual acks with a
// prefetch. A consumer that dies closes its channel, and RabbitMQ requeues
// what it had not acked.
type amqpBroker struct {
	conn *amqp.Connection
	pub  *amqp.Channel
	// outstanding counts messages published and not yet acked or dead-lettered.
	outstanding atomic.Int64
}

func openAMQP(ctx context.Context, url string, fresh bool) (*amqpBroker, error) {
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		return nil, fmt.Errorf("cannot reach RabbitMQ at %s: %w", redact(url), err)
	}
	b := &amqpBroker{conn: conn}
	if b.pub, err = conn.Channel(); err != nil {
		b.close()
		return nil, err
	}
	for _, q := range []string{amqpQueue, amqpDeadQueue} {
		if fresh {
			if _, err := b.pub.QueueDelete(q, false, false, false); err != nil {
				b.close()
				return nil, fmt.Errorf("RabbitMQ: remove the previous demo queue %s: %w", q, err)
			}
		}
		if _, err := b.pub.QueueDeclare(q, true, false, false, false, nil); err != nil {
			b.close()
			return nil, fmt.Errorf("RabbitMQ: declare %s: %w", q, err)
		}
	}
	if !fresh {
		q, err := b.pub.QueueDeclarePassive(amqpQueue, true, false, false, false, nil)
		if err == nil {
			b.outstanding.Store(int64(q.Messages))
		}
	}
	if err := b.pub.Confirm(false); err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

// publishTo publishes a persistent message and waits for the broker's confirm.
func (b *amqpBroker) publishTo(ctx context.Context, queue string, msg amqp.Publishing) error {
	msg.DeliveryMode = amqp.Persistent
	conf, err := b.pub.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, msg)
	if err != nil {
		return err
	}
	ok, err := conf.WaitContext(ctx)
	if err == nil && !ok {
		err = fmt.Errorf("RabbitMQ did not confirm the publish to %s", queue)
	}
	return err
}

func (b *amqpBroker) publish(ctx context.Context, id string, payload []byte) (bool, error) {
	b.outstanding.Add(1)
	err := b.publishTo(ctx, amqpQueue, amqp.Publishing{MessageId: id, ContentType: "application/json", Body: payload})
	if err != nil {
		b.outstanding.Add(-1)
	}
	return false, err
}

func (b *amqpBroker) deadLetter(ctx context.Context, d delivery, reason error) error {
	return b.publishTo(ctx, amqpDeadQueue, amqp.Publishing{MessageId: d.id(), Body: d.payload(),
		Headers: amqp.Table{"idem-dead-letter-reason": reason.Error()}})
}

func (b *amqpBroker) worker(ctx context.Context) (demoWorker, error) {
	ch, err := b.conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Qos(64, 0, false); err != nil {
		ch.Close()
		return nil, err
	}
	msgs, err := ch.Consume(amqpQueue, "", false, false, false, false, nil)
	if err != nil {
		ch.Close()
		return nil, err
	}
	return &amqpWorker{b: b, ch: ch, msgs: msgs}, nil
}

// unfinished counts messages published and not yet acked (by the demo's
// own count), which is zero only when the queue is drained too.
func (b *amqpBroker) unfinished(ctx context.Context) (int, error) {
	q, err := b.pub.QueueDeclarePassive(amqpQueue, true, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	return q.Messages + int(max(b.outstanding.Load(), 0)), nil
}

func (b *amqpBroker) close() {
	if b.conn != nil {
		b.conn.Close()
	}
}

type amqpWorker struct {
	b    *amqpBroker
	ch   *amqp.Channel
	msgs <-chan amqp.Delivery
}

func (w *amqpWorker) fetch(ctx context.Context, n int, maxWait time.Duration) ([]delivery, error) {
	var out []delivery
	timer := time.NewTimer(maxWait)
	defer timer.Stop()
	for len(out) < n {
		select {
		case d, ok := <-w.msgs:
			if !ok {
				return out, fmt.Errorf("RabbitMQ channel closed")
			}
			out = append(out, amqpDelivery{w.b, d})
			if len(out) > 0 && len(w.msgs) == 0 {
				return out, nil
			}
		case <-timer.C:
			return out, nil
		case <-ctx.Done():
			return out, ctx.Err()
		}
	}
	return out, nil
}

func (w *amqpWorker) batchDone(context.Context) {}

// crash closes the channel: RabbitMQ requeues every message it delivered
// on it that was not acked.
func (w *amqpWorker) crash() { w.ch.Close() }
func (w *amqpWorker) close() { w.ch.Close() }

type amqpDelivery struct {
	b *amqpBroker
	d amqp.Delivery
}

func (d amqpDelivery) id() string      { return d.d.MessageId }
func (d amqpDelivery) payload() []byte { return d.d.Body }

func (d amqpDelivery) ack() error {
	err := d.d.Ack(false)
	if err == nil {
		d.b.outstanding.Add(-1)
	}
	return err
}

// retryAfter requeues the message after t (RabbitMQ has no delayed nack).
func (d amqpDelivery) retryAfter(t time.Duration) error {
	time.AfterFunc(t, func() { _ = d.d.Nack(false, true) })
	return nil
}

func (d amqpDelivery) settle() error { return d.ack() }

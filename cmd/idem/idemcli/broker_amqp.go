//go:build !nodemo

package idemcli

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemamqp"
)

// The demo's RabbitMQ names. The message ID travels in the message_id property.
const (
	amqpQueue     = "idem-demo-payments"
	amqpDeadQueue = "idem-demo-payments-dead"
)

// amqpBroker carries the demo's messages on RabbitMQ through idemamqp:
// durable queues, persistent messages published with confirms, manual acks
// with a prefetch. Each member has a connection of its own; a member that
// dies closes it, and RabbitMQ requeues what it had not acked.
type amqpBroker struct {
	url  string
	conn *amqp.Connection
	ch   *amqp.Channel // queue declarations and counts
	prod *idemamqp.Producer
	// outstanding counts messages published and not yet acked or
	// dead-lettered, by the demo's own count: AMQP does not tell a queue's
	// unacked messages.
	outstanding atomic.Int64
}

func dialAMQP(url string) (*amqp.Connection, error) {
	return amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
}

func openAMQP(_ context.Context, url string, fresh bool) (*amqpBroker, error) {
	conn, err := dialAMQP(url)
	if err != nil {
		return nil, fmt.Errorf("cannot reach RabbitMQ at %s: %w", redact(url), err)
	}
	b := &amqpBroker{url: url, conn: conn, prod: idemamqp.NewProducer(conn, idemamqp.ProducerConfig{})}
	if b.ch, err = conn.Channel(); err != nil {
		b.close()
		return nil, err
	}
	for _, q := range []string{amqpQueue, amqpDeadQueue} {
		if fresh {
			if _, err := b.ch.QueueDelete(q, false, false, false); err != nil {
				b.close()
				return nil, fmt.Errorf("RabbitMQ: remove the previous demo queue %s: %w", q, err)
			}
		}
		if _, err := b.ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			b.close()
			return nil, fmt.Errorf("RabbitMQ: declare %s: %w", q, err)
		}
	}
	if n, err := b.count(amqpQueue); err == nil && !fresh {
		b.outstanding.Store(n)
	}
	return b, nil
}

func (b *amqpBroker) publish(ctx context.Context, id string, payload []byte) (bool, error) {
	b.outstanding.Add(1)
	_, err := b.prod.Publish(ctx, amqpQueue, payload, idemamqp.WithMessageID(id), idemamqp.WithContentType("application/json"))
	if err != nil {
		b.outstanding.Add(-1)
	}
	return false, err
}

// member consumes on a new connection, which its crash closes. Its
// processor counts the messages settled for good.
func (b *amqpBroker) member(_ context.Context, p idem.Processor, log *slog.Logger) (*member, error) {
	conn, err := dialAMQP(b.url)
	if err != nil {
		return nil, err
	}
	counted := idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
		out, err := p.Process(ctx, msg)
		if out.Ack() || out.DeadLetter() {
			b.outstanding.Add(-1)
		}
		return out, err
	})
	c, err := idemamqp.NewConsumer(conn, idemamqp.Config{Processor: counted, Queue: amqpQueue, DeadLetter: amqpDeadQueue,
		Prefetch: 32, RetryDelay: demoRetryDelay, Logger: log})
	if err != nil {
		conn.Close()
		return nil, err
	}
	return &member{run: c.Run, shutdown: func() { conn.Close() }}, nil
}

// count returns the messages ready in queue q.
func (b *amqpBroker) count(q string) (int64, error) {
	info, err := b.ch.QueueDeclarePassive(q, true, false, false, false, nil)
	return int64(info.Messages), err
}

// unfinished counts messages published and not yet acked (by the demo's
// own count), which is zero only when the queue is drained too.
func (b *amqpBroker) unfinished(context.Context) (int, error) {
	n, err := b.count(amqpQueue)
	return int(n + max(b.outstanding.Load(), 0)), err
}

func (b *amqpBroker) deadLettered(context.Context) (int64, error) { return b.count(amqpDeadQueue) }

func (b *amqpBroker) close() {
	_ = b.prod.Close()
	_ = b.conn.Close()
}

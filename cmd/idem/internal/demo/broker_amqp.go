//go:build !nodemo

package demo

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemamqp"
	"github.com/idem-go/idem/cmd/idem/internal/connect"
	"github.com/idem-go/idem/cmd/idem/internal/secret"
)

// The demo's RabbitMQ names. The message ID travels in the message_id property.
const (
	amqpQueue     = "idem-demo-payments"
	amqpDeadQueue = "idem-demo-payments-dead"
	// amqpEventsQueue holds the receipts story's PaymentCharged events,
	// sent by the outbox relay on the default exchange.
	amqpEventsQueue = "idem-demo-payments-charged"
)

// amqpBroker carries the demo's messages on RabbitMQ through idemamqp:
// durable queues, persistent messages published with confirms, manual acks
// with a prefetch. Each member has a connection of its own; a member that
// dies closes it, and RabbitMQ requeues what it had not acked. A broker
// restart closes every connection: the producer and the members redial
// (idemamqp's Redial, with backoff), declaring the queues again on the new
// connection, and the counts reopen their own.
type amqpBroker struct {
	url  string
	mu   sync.Mutex
	conn *amqp.Connection // queue declarations and counts
	ch   *amqp.Channel
	prod *idemamqp.Producer
	// outstanding counts messages published and not yet acked or
	// dead-lettered, by the demo's own count: AMQP does not tell a queue's
	// unacked messages.
	outstanding atomic.Int64
	// eventsOutstanding is outstanding for the events queue; relayConn is
	// the relay publisher's first connection, relayPub the publisher
	// (whose Close closes the connections it redialed).
	eventsOutstanding atomic.Int64
	relayConn         *amqp.Connection
	relayPub          *idemamqp.Publisher
}

func openAMQP(_ context.Context, url string, fresh bool) (_ *amqpBroker, err error) {
	defer func() { err = secret.Error(err, url) }()
	conn, err := connect.AMQP(url)
	if err != nil {
		return nil, fmt.Errorf("cannot reach RabbitMQ at %s: %w", secret.URL(url), err)
	}
	b := &amqpBroker{url: url, conn: conn}
	if b.ch, err = conn.Channel(); err != nil {
		b.close()
		return nil, err
	}
	for _, q := range []string{amqpQueue, amqpDeadQueue, amqpEventsQueue} {
		if fresh {
			if _, err := b.ch.QueueDelete(q, false, false, false); err != nil {
				b.close()
				return nil, fmt.Errorf("RabbitMQ: remove the previous demo queue %s: %w", q, err)
			}
		}
	}
	if err := declareAMQP(b.ch); err != nil {
		b.close()
		return nil, err
	}
	b.prod = idemamqp.NewProducer(conn, idemamqp.ProducerConfig{Redial: b.redial, MaxReconnectInterval: amqpMaxRedialInterval})
	if n, err := b.count(amqpQueue); err == nil && !fresh {
		b.outstanding.Store(n)
	}
	if n, err := b.count(amqpEventsQueue); err == nil && !fresh {
		b.eventsOutstanding.Store(n)
	}
	return b, nil
}

// amqpMaxRedialInterval is the longest wait between two redials after a
// broker restart: short, so the demo resumes soon after the broker is back.
const amqpMaxRedialInterval = 2 * time.Second

// declareAMQP declares the demo's durable queues (again, after a broker
// restart: durable queues survive it, but a broker that lost its state
// would have none).
func declareAMQP(ch *amqp.Channel) error {
	for _, q := range []string{amqpQueue, amqpDeadQueue, amqpEventsQueue} {
		if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			return fmt.Errorf("RabbitMQ: declare %s: %w", q, err)
		}
	}
	return nil
}

// redial dials a new connection and declares the demo's queues on it: the
// Redial of the producer and of every member.
func (b *amqpBroker) redial(context.Context) (*amqp.Connection, error) {
	conn, err := connect.AMQP(b.url)
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = declareAMQP(ch)
		_ = ch.Close()
	}
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	return conn, nil
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
	return b.join(amqpQueue, &b.outstanding, p, log)
}

// join consumes queue on a new connection, counting down outstanding.
func (b *amqpBroker) join(queue string, outstanding *atomic.Int64, p idem.Processor, log *slog.Logger) (*member, error) {
	conn, err := connect.AMQP(b.url)
	if err != nil {
		return nil, err
	}
	counted := idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
		out, err := p.Process(ctx, msg)
		if out.Ack() || out.DeadLetter() {
			outstanding.Add(-1)
		}
		return out, err
	})
	c, err := idemamqp.NewConsumer(conn, idemamqp.Config{Processor: counted, Queue: queue, DeadLetter: amqpDeadQueue,
		Prefetch: 32, RetryDelay: demoRetryDelay, Logger: log, Redial: b.redial, MaxReconnectInterval: amqpMaxRedialInterval})
	if err != nil {
		conn.Close()
		return nil, err
	}
	return &member{run: c.Run, shutdown: func() { conn.Close() }}, nil
}

// count returns the messages ready in queue q, on a new connection when
// the last one closed.
func (b *amqpBroker) count(q string) (int64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil || b.ch.IsClosed() {
		if b.conn != nil {
			_ = b.conn.Close()
		}
		b.conn, b.ch = nil, nil
		conn, err := b.redial(context.Background())
		if err != nil {
			return 0, err
		}
		if b.ch, err = conn.Channel(); err != nil {
			_ = conn.Close()
			return 0, err
		}
		b.conn = conn
	}
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
	if b.relayPub != nil {
		_ = b.relayPub.Close()
	}
	if b.relayConn != nil {
		_ = b.relayConn.Close()
	}
	if b.prod != nil {
		_ = b.prod.Close()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.conn != nil {
		_ = b.conn.Close()
	}
}

// eventsDestination is the queue of the PaymentCharged events.
func (b *amqpBroker) eventsDestination() string { return amqpEventsQueue }

// eventsPublisher is the relay's RabbitMQ publisher (confirms, message_id)
// on a connection of its own, redialed after a broker restart. It counts
// the messages it publishes as outstanding until a receipts member acks
// them, as publish does for the payments.
func (b *amqpBroker) eventsPublisher(context.Context) (idem.Publisher, error) {
	conn, err := connect.AMQP(b.url)
	if err != nil {
		return nil, err
	}
	b.relayConn = conn
	pub := idemamqp.NewPublisher(conn, idemamqp.ProducerConfig{Redial: b.redial, MaxReconnectInterval: amqpMaxRedialInterval})
	b.relayPub = pub
	return idem.PublisherFunc(func(ctx context.Context, msgs []idem.Outgoing) []error {
		b.eventsOutstanding.Add(int64(len(msgs)))
		errs := pub.Publish(ctx, msgs)
		for _, err := range errs {
			if err != nil {
				b.eventsOutstanding.Add(-1)
			}
		}
		return errs
	}), nil
}

// receiptsMember consumes the events queue on a new connection.
func (b *amqpBroker) receiptsMember(_ context.Context, p idem.Processor, log *slog.Logger) (*member, error) {
	return b.join(amqpEventsQueue, &b.eventsOutstanding, p, log)
}

func (b *amqpBroker) eventsUnfinished(context.Context) (int, error) {
	n, err := b.count(amqpEventsQueue)
	return int(n + max(b.eventsOutstanding.Load(), 0)), err
}

package idemamqp_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/broker/idemamqp"
	amqp "github.com/rabbitmq/amqp091-go"
)

// amqpBroker is the brokertest.Broker of one queue and its dead-letter
// queue on the test RabbitMQ.
type amqpBroker struct {
	t          *testing.T
	url        string
	conn       *tapConn
	queue      string
	dead       string
	producer   *idemamqp.Producer
	deadLetter sync.Mutex // one DeadLetters read at a time
}

func newAMQPBroker(t *testing.T) brokertest.Broker { return newAMQPBrokerAt(t, testURL(t)) }

// newAMQPBrokerAt is newAMQPBroker on the RabbitMQ at url.
func newAMQPBrokerAt(t *testing.T, url string) *amqpBroker {
	conn, err := dialTap(url, "idem-test-broker")
	if err != nil {
		t.Fatalf("dial RabbitMQ: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	q, dead := queuesAt(t, conn.Connection, url)
	p := idemamqp.NewProducer(conn.Connection, idemamqp.ProducerConfig{})
	t.Cleanup(func() { _ = p.Close() })
	return &amqpBroker{t: t, url: url, conn: conn, queue: q, dead: dead, producer: p}
}

func (b *amqpBroker) Publish(ctx context.Context, id string, payload []byte) error {
	if len(id) > 255 {
		// The message_id property is a shortstr.
		return brokertest.ErrNotCarried
	}
	if idem.ValidateMessageID(id, 0) != nil {
		// No ID, or one the Producer refuses: published as is, for the
		// consumer to dead-letter.
		return rawPublish(ctx, b.conn.Connection, b.queue, amqp.Publishing{MessageId: id, Body: payload})
	}
	_, err := b.producer.Publish(ctx, b.queue, payload, idemamqp.WithMessageID(id))
	return err
}

// newConsumer returns a Consumer of the queue on a connection of its own.
func (b *amqpBroker) newConsumer(p idem.Processor, opts brokertest.StartOptions) (*tapConn, *idemamqp.Consumer, error) {
	conn, err := dialTap(b.url, "idem-test-member")
	if err != nil {
		return nil, nil, err
	}
	c, err := idemamqp.NewConsumer(conn.Connection, idemamqp.Config{
		Processor:      p,
		Queue:          b.queue,
		DeadLetter:     b.dead,
		Concurrency:    max(opts.Concurrency, 1),
		Prefetch:       opts.Prefetch,
		HandlerTimeout: opts.HandlerTimeout,
		RetryDelay:     max(opts.Redelivery/4, 50*time.Millisecond),
		Logger:         quiet(),
	})
	if err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	return conn, c, nil
}

// NewConsumer implements brokertest.Broker: the Consumer, on its own
// connection, closed at cleanup.
func (b *amqpBroker) NewConsumer(p idem.Processor, opts brokertest.StartOptions) (brokertest.Runner, error) {
	conn, c, err := b.newConsumer(p, opts)
	if err != nil {
		return nil, err
	}
	b.t.Cleanup(func() { _ = conn.Close() })
	return c, nil
}

func (b *amqpBroker) Start(ctx context.Context, p idem.Processor, opts brokertest.StartOptions) (brokertest.Member, error) {
	conn, c, err := b.newConsumer(p, opts)
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m := &amqpMember{conn: conn, c: c, cancel: cancel, done: make(chan error, 1)}
	go func() { m.done <- c.Run(runCtx) }()
	select {
	case <-c.Ready():
	case err := <-m.done:
		cancel()
		_ = conn.Close()
		return nil, fmt.Errorf("consumer ended before consuming: %v", err)
	case <-ctx.Done():
		cancel()
		_ = conn.Close()
		return nil, ctx.Err()
	}
	b.t.Cleanup(m.Crash)
	return m, nil
}

func (b *amqpBroker) DeadLetters(ctx context.Context) ([]brokertest.DeadLetter, error) {
	b.deadLetter.Lock()
	defer b.deadLetter.Unlock()
	return readDeadLetters(b.conn.Connection, b.dead)
}

// readDeadLetters reads every message of queue dead without consuming it:
// basic.get without ack, then closing the channel requeues them all.
func readDeadLetters(conn *amqp.Connection, dead string) ([]brokertest.DeadLetter, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	defer ch.Close()
	var out []brokertest.DeadLetter
	for {
		d, ok, err := ch.Get(dead, false)
		if err != nil {
			return nil, err
		}
		if !ok {
			return out, nil
		}
		reason, _ := d.Headers[idem.HeaderDeadLetterReason].(string)
		text, _ := d.Headers[idem.HeaderDeadLetterError].(string)
		out = append(out, brokertest.DeadLetter{ID: d.MessageId, Payload: d.Body, Reason: reason, Error: text})
	}
}

type amqpMember struct {
	conn   *tapConn
	c      *idemamqp.Consumer
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

func (m *amqpMember) Stop(ctx context.Context) error {
	err := m.c.Stop(ctx)
	m.once.Do(func() {
		m.cancel()
		_ = m.conn.Close()
	})
	return err
}

// Crash cuts the member's TCP connection, as a killed process would: no
// ack or nack reaches the broker any more, and RabbitMQ requeues every
// delivery it had not acked.
func (m *amqpMember) Crash() {
	m.once.Do(func() {
		m.conn.cut()
		m.cancel()
	})
}

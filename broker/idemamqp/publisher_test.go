package idemamqp_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemamqp"
	amqp "github.com/rabbitmq/amqp091-go"
)

// OutboxPublisher implements brokertest.OutboxBroker: the relay publishes
// on the default exchange with the work queue's name as routing key.
func (b *amqpBroker) OutboxPublisher() (idem.Publisher, string) {
	pub := idemamqp.NewPublisher(b.conn.Connection, idemamqp.ProducerConfig{
		// A new connection when the broker closed the first (its restart).
		Redial:               func(context.Context) (*amqp.Connection, error) { return amqp.Dial(b.url) },
		MaxReconnectInterval: 200 * time.Millisecond,
	})
	b.t.Cleanup(func() { _ = pub.Close() })
	return pub, b.queue
}

// TestPublisherBatch publishes a batch with an invalid ID and an
// unroutable message between good ones: one error per message, the
// invalid one permanent, the unroutable one retryable
// (ErrPublishUnroutable), the good ones in the queue with message_id and
// headers.
func TestPublisherBatch(t *testing.T) {
	t.Parallel()
	conn := dial(t, "idem-test-publisher")
	q, _ := queues(t, conn.Connection)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	pub := idemamqp.NewPublisher(conn.Connection, idemamqp.ProducerConfig{})
	errs := pub.Publish(ctx, []idem.Outgoing{
		{ID: "out-1", Destination: q, Payload: []byte("one"), Headers: map[string]string{"trace": "t1"}},
		{ID: "bad\x00id", Destination: q, Payload: []byte("two")},
		{ID: "out-3", Destination: q + ".missing", Payload: []byte("three")},
		{ID: "out-4", Destination: q, Payload: []byte("four")},
	})
	if len(errs) != 4 || errs[0] != nil || errs[3] != nil || !errors.Is(errs[1], idem.ErrPermanent) ||
		!errors.Is(errs[2], idemamqp.ErrPublishUnroutable) || errors.Is(errs[2], idem.ErrPermanent) {
		t.Fatalf("errors %v: want nil, permanent, unroutable, nil", errs)
	}
	ch, err := conn.Connection.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	for _, want := range []string{"out-1", "out-4"} {
		d, ok, err := ch.Get(q, true)
		if err != nil || !ok {
			t.Fatalf("get %s: %v, %v", want, ok, err)
		}
		if d.MessageId != want {
			t.Fatalf("got %q, want %q", d.MessageId, want)
		}
		if want == "out-1" && (d.Headers["trace"] != "t1" || string(d.Body) != "one") {
			t.Fatalf("out-1: headers %v, body %q", d.Headers, d.Body)
		}
	}
}

// UndeliverableDestination implements brokertest.OutboxUndeliverable: a
// routing key no queue has, so the broker returns the message (retryable:
// the queue may yet be declared).
func (b *amqpBroker) UndeliverableDestination(*testing.T) (string, bool) {
	return b.queue + ".missing", false
}

// TestPublisherClose closes a publisher that has published: its channel
// closes, a later Publish fails (ErrConnectionClosed), a second Close is
// a no-op, and the caller's connection stays open.
func TestPublisherClose(t *testing.T) {
	t.Parallel()
	conn := dial(t, "idem-test-publisher-close")
	q, _ := queues(t, conn.Connection)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	pub := idemamqp.NewPublisher(conn.Connection, idemamqp.ProducerConfig{})
	if errs := pub.Publish(ctx, []idem.Outgoing{{ID: "out-1", Destination: q, Payload: []byte("one")}}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	if err := pub.Close(); err != nil {
		t.Fatal(err)
	}
	if err := pub.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	errs := pub.Publish(ctx, []idem.Outgoing{{ID: "out-2", Destination: q, Payload: []byte("two")}})
	if !errors.Is(errs[0], idemamqp.ErrConnectionClosed) {
		t.Fatalf("Publish after Close: %v, want ErrConnectionClosed", errs[0])
	}
	if conn.Connection.IsClosed() {
		t.Fatal("Close closed the caller's connection")
	}
	ch, err := conn.Connection.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if d, ok, err := ch.Get(q, true); err != nil || !ok || d.MessageId != "out-1" {
		t.Fatalf("queue: %q, %v, %v; want out-1 only", d.MessageId, ok, err)
	}
	if _, ok, err := ch.Get(q, true); err != nil || ok {
		t.Fatalf("queue has a second message (%v, %v)", ok, err)
	}
}

package idemamqp_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem/broker/idemamqp"
	"github.com/idem-go/idem/internal/testenv"
)

// TestProducerRedial: a Producer whose connection is cut publishes on a
// connection from ProducerConfig.Redial, closes that one on Close, and
// never closes the caller's.
func TestProducerRedial(t *testing.T) {
	t.Parallel()
	admin := dial(t, "idem-test-producer-admin")
	q, _ := queues(t, admin.Connection)
	first := dial(t, "idem-test-producer")

	var mu sync.Mutex
	var redialled []*tapConn
	prod := idemamqp.NewProducer(first.Connection, idemamqp.ProducerConfig{
		Redial: func(context.Context) (*amqp.Connection, error) {
			c, err := dialTap(testURL(t), "idem-test-producer-redialled")
			if err != nil {
				return nil, err
			}
			mu.Lock()
			redialled = append(redialled, c)
			mu.Unlock()
			return c.Connection, nil
		},
		MaxReconnectInterval: time.Second,
	})
	ctx := context.Background()
	if _, err := prod.Publish(ctx, q, []byte("1"), idemamqp.WithMessageID("p-1")); err != nil {
		t.Fatal(err)
	}
	first.cut()
	testenv.Eventually(t, 30*time.Second, "the connection to close", first.IsClosed, nil)
	if _, err := prod.Publish(ctx, q, []byte("2"), idemamqp.WithMessageID("p-2")); err != nil {
		t.Fatalf("publish after the connection closed: %v", err)
	}
	if got := queueDepth(t, admin.Connection, q); got != 2 {
		t.Errorf("queue holds %d messages, want 2", got)
	}
	mu.Lock()
	n := len(redialled)
	mu.Unlock()
	if n != 1 {
		t.Fatalf("Redial called %d times, want 1", n)
	}
	if err := prod.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if !redialled[0].IsClosed() {
		t.Error("Close left the redialled connection open")
	}
}

// TestProducerRedialGivesUp: while Redial keeps failing, Publish waits
// with backoff and returns when its context ends, with an error matching
// ErrConnectionClosed and the context's.
func TestProducerRedialGivesUp(t *testing.T) {
	t.Parallel()
	first := dial(t, "idem-test-producer-giveup")
	q, _ := queues(t, first.Connection)
	attempts := make(chan struct{}, 1000)
	prod := idemamqp.NewProducer(first.Connection, idemamqp.ProducerConfig{
		Redial: func(context.Context) (*amqp.Connection, error) {
			attempts <- struct{}{}
			return nil, errors.New("refused")
		},
		MaxReconnectInterval: 50 * time.Millisecond,
	})
	defer prod.Close()
	_ = first.Close()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := prod.Publish(ctx, q, []byte("x"), idemamqp.WithMessageID("g-1"))
		errc <- err
	}()
	<-attempts
	<-attempts // a second attempt, after a backoff
	cancel()
	err := <-errc
	if !errors.Is(err, idemamqp.ErrConnectionClosed) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Publish = %v, want ErrConnectionClosed and context.Canceled", err)
	}
}

package idemamqp_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemamqp"
	"github.com/idem-go/idem/internal/testenv"
)

// TestHandlerTimeout: a first delivery whose handler blocks on something
// only its context ends (a database call on a stalled connection) gives up
// when HandlerTimeout ends that context, and the delivery is requeued and
// processed by the next attempt, instead of being held until RabbitMQ's
// consumer_timeout closes the channel.
func TestHandlerTimeout(t *testing.T) {
	t.Parallel()
	conn := dial(t, "idem-test-handler-timeout")
	q, dead := queues(t, conn.Connection)
	var (
		mu       sync.Mutex
		attempts int
		firstErr error
	)
	p := idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
		mu.Lock()
		attempts++
		n := attempts
		mu.Unlock()
		if n == 1 {
			<-ctx.Done() // stalled until the handler's context ends
			mu.Lock()
			firstErr = ctx.Err()
			mu.Unlock()
			return idem.Outcome{Status: idem.Failed, Err: ctx.Err()}, ctx.Err()
		}
		return idem.Outcome{Status: idem.Processed, MessageID: msg.ID}, nil
	})
	start(t, conn.Connection, idemamqp.Config{Processor: p, Queue: q, DeadLetter: dead,
		HandlerTimeout: 300 * time.Millisecond, RetryDelay: 100 * time.Millisecond})
	prod := idemamqp.NewProducer(conn.Connection, idemamqp.ProducerConfig{})
	defer prod.Close()
	if _, err := prod.Publish(context.Background(), q, []byte("x")); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the message processed after its first attempt timed out", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return attempts >= 2 && queueDepth(t, conn.Connection, q) == 0
	}, nil)
	mu.Lock()
	defer mu.Unlock()
	if attempts != 2 || !errors.Is(firstErr, context.DeadlineExceeded) {
		t.Errorf("%d attempts, the first ended with %v; want 2, the first by its deadline", attempts, firstErr)
	}
	if n := queueDepth(t, conn.Connection, dead); n != 0 {
		t.Errorf("%d dead letters, want 0", n)
	}
}

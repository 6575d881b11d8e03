package idemamqp_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemamqp"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/testenv"
)

// channelLog counts the consumer's log records that say a channel was
// lost or an ack failed: what acking a delivery twice, or acking one
// already nacked, makes RabbitMQ do (it closes the channel with
// PRECONDITION_FAILED, unknown delivery tag).
type channelLog struct {
	mu   sync.Mutex
	bad  []string
	next slog.Handler
}

func (h *channelLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *channelLog) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "channel lost") || strings.Contains(r.Message, "ack") && strings.Contains(r.Message, "failed") {
		h.mu.Lock()
		h.bad = append(h.bad, r.Message)
		h.mu.Unlock()
	}
	return nil
}
func (h *channelLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *channelLog) WithGroup(string) slog.Handler      { return h }

// TestBreakHandlerTimeoutRacesAMQP: on RabbitMQ, with a HandlerTimeout of
// 200ms, the first delivery of each message runs a handler deaf to its
// context that succeeds just before, at, just after or well after the
// deadline (lease mode, memory store; the external call made before the
// wait). Every message is processed: its external call made once, the
// queue emptied, nothing dead-lettered, and no channel lost or ack
// refused (a delivery acked twice, or acked after its nack, closes the
// channel).
func TestBreakHandlerTimeoutRacesAMQP(t *testing.T) {
	t.Parallel()
	const timeout, messages = 200 * time.Millisecond, 16
	conn := dial(t, "idem-test-breakit-handler-timeout")
	q, dead := queues(t, conn.Connection)
	store := idem.NewMemoryStore(nil)
	lc, err := idem.NewLeaseConsumer(store, idem.Config{Name: "amqp", Lease: time.Minute, PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lc.Close() })
	var (
		mu    sync.Mutex
		calls = map[string]int{}
		runs  = map[string]int{}
	)
	waits := []time.Duration{timeout - time.Millisecond, timeout, timeout + time.Millisecond, 2 * timeout}
	p := idem.BindLease(lc, func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
		id := a.Message.ID
		mu.Lock()
		calls[id]++ // the external call
		runs[id]++
		first := runs[id] == 1
		mu.Unlock()
		if first {
			var i int
			_, _ = fmt.Sscanf(id, "m-%d", &i)
			time.Sleep(waits[i%len(waits)]) // the handler's own work, deaf to ctx
		}
		return idem.Result{Body: []byte("ok")}, nil
	})
	logs := &channelLog{}
	start(t, conn.Connection, idemamqp.Config{Processor: p, Queue: q, DeadLetter: dead, Concurrency: 4,
		HandlerTimeout: timeout, RetryDelay: 50 * time.Millisecond, Logger: slog.New(logs)})
	prod := idemamqp.NewProducer(conn.Connection, idemamqp.ProducerConfig{})
	defer prod.Close()
	for i := range messages {
		if _, err := prod.Publish(context.Background(), q, []byte("x"), idemamqp.WithMessageID(fmt.Sprintf("m-%02d", i))); err != nil {
			t.Fatal(err)
		}
	}
	completed := func() int {
		n := 0
		for i := range messages {
			rec, err := store.Inspect(context.Background(), "amqp", fmt.Sprintf("m-%02d", i))
			if err == nil && rec.State == idemdriver.StateCompleted {
				n++
			}
		}
		return n
	}
	testenv.Eventually(t, 30*time.Second, "every message's record completed and the queue empty", func() bool {
		return completed() == messages && queueDepth(t, conn.Connection, q) == 0
	}, func() string { return fmt.Sprintf("%d of %d completed", completed(), messages) })
	// The consumer still consumes (its channel was not closed by an ack
	// of a settled delivery): one more copy of m-00 is taken.
	prod2 := idemamqp.NewProducer(conn.Connection, idemamqp.ProducerConfig{})
	defer prod2.Close()
	if _, err := prod2.Publish(context.Background(), q, []byte("x"), idemamqp.WithMessageID("m-00")); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the duplicate consumed", func() bool { return queueDepth(t, conn.Connection, q) == 0 }, nil)
	mu.Lock()
	defer mu.Unlock()
	for id, n := range calls {
		if n != 1 {
			t.Errorf("%s: external call made %d times, want 1", id, n)
		}
	}
	if n := queueDepth(t, conn.Connection, dead); n != 0 {
		t.Errorf("%d dead letters, want 0", n)
	}
	logs.mu.Lock()
	defer logs.mu.Unlock()
	if len(logs.bad) > 0 {
		t.Errorf("the consumer logged %q: a delivery settled twice?", logs.bad)
	}
}

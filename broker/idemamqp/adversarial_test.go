package idemamqp_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemamqp"
	"github.com/idem-go/idem/internal/testenv"
	amqp "github.com/rabbitmq/amqp091-go"
	_ "modernc.org/sqlite"
)

// Adversarial tests: bad input, failing dependencies and lifecycle abuse.
// The invariant checked everywhere: a delivery that cannot be processed is
// never acked as done, and effects happen exactly once.

// A dead-letter queue that refuses the publish (full, with
// x-overflow=reject-publish: the broker nacks it) never lets the original
// be acked; once it has room, the message is dead-lettered.
func TestDeadLetterNackedIsNotAck(t *testing.T) {
	t.Parallel()
	conn := dial(t, "idem-test-dl-nack")
	q := randName("idem-test-")
	dead := q + ".dead"
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	t.Cleanup(func() {
		if c, err := conn.Channel(); err == nil {
			_, _ = c.QueueDelete(q, false, false, false)
			_, _ = c.QueueDelete(dead, false, false, false)
			_ = c.Close()
		}
	})
	if _, err := ch.QueueDeclare(q, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(dead, false, false, false, false, amqp.Table{"x-max-length": int32(0), "x-overflow": "reject-publish"}); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	p := idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
		calls.Add(1)
		return idem.Outcome{Status: idem.Rejected, Err: idem.ErrMissingMessageID}, idem.ErrMissingMessageID
	})
	cfg := idemamqp.Config{Processor: p, Queue: q, DeadLetter: dead, RetryDelay: 100 * time.Millisecond}
	c, res := start(t, conn.Connection, cfg)
	if err := rawPublish(context.Background(), conn.Connection, q, amqp.Publishing{Body: []byte("bad")}); err != nil {
		t.Fatal(err)
	}
	// Redelivered again and again: never acked.
	testenv.Eventually(t, 30*time.Second, "three attempts", func() bool { return calls.Load() >= 3 }, nil)
	// Stop before making room: a dead letter the broker confirms into a
	// queue deleted a moment later is gone with that queue (broker
	// semantics, not the adapter's), so no publish may be in flight while
	// the queue is replaced.
	stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	<-res.done
	if res.err != nil {
		t.Fatalf("Run: %v", res.err)
	}
	if n := queueDepth(t, conn.Connection, q); n != 1 {
		t.Fatalf("after the refused dead letters: %d messages in the queue, want 1 (never acked)", n)
	}
	// Make room: a new dead-letter queue of the same name without the limit.
	if _, err := ch.QueueDelete(dead, false, false, false); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(dead, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	_, res = start(t, conn.Connection, cfg)
	describe := func() string {
		state := "running"
		select {
		case <-res.done:
			state = fmt.Sprintf("Run returned %v", res.err)
		default:
		}
		return fmt.Sprintf("queue %d, dead letters %d, %d attempts, consumer %s",
			queueDepth(t, conn.Connection, q), queueDepth(t, conn.Connection, dead), calls.Load(), state)
	}
	testenv.Eventually(t, 30*time.Second, "the dead letter", func() bool { return queueDepth(t, conn.Connection, dead) == 1 }, describe)
	testenv.Eventually(t, 30*time.Second, "the queue to drain", func() bool { return queueDepth(t, conn.Connection, q) == 0 }, describe)
}

// IDs in a header (Config.IDHeader), where AMQP's 255-byte shortstr limit
// on message_id does not apply and a value may have another type: a
// 4000-byte ID and a control character are invalid, a number counts as
// missing; each is dead-lettered byte for byte with its reason word, and a
// good ID in the same header is processed once. (IDs in message_id are in
// the conformance suite.)
func TestBadMessageIDsInHeader(t *testing.T) {
	t.Parallel()
	conn := dial(t, "idem-test-bad-ids")
	q, dead := queues(t, conn.Connection)
	e := newEffects()
	start(t, conn.Connection, idemamqp.Config{Processor: txProcessor(t, e, nil), Queue: q, DeadLetter: dead,
		IDHeader: "x-msg-id", Concurrency: 4, RetryDelay: 100 * time.Millisecond})
	ctx := context.Background()
	want := map[string]string{ // payload: reason
		"long":  idem.ReasonInvalidMessageID,
		"ctrl":  idem.ReasonInvalidMessageID,
		"typed": idem.ReasonMissingMessageID,
	}
	for payload, id := range map[string]any{"long": strings.Repeat("x", 4000), "ctrl": "a\nb", "typed": int64(42), "good": "été-🙂"} {
		if err := rawPublish(ctx, conn.Connection, q, amqp.Publishing{Body: []byte(payload), Headers: amqp.Table{"x-msg-id": id}}); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 30*time.Second, "every message settled", func() bool {
		return queueDepth(t, conn.Connection, q) == 0 && queueDepth(t, conn.Connection, dead) == len(want) && len(e.snapshot()) == 1
	}, nil)
	if n := e.snapshot()["été-🙂"]; n != 1 {
		t.Errorf("good ID: %d effects, want 1", n)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	for range want {
		d, ok, err := ch.Get(dead, true)
		if err != nil || !ok {
			t.Fatalf("get dead letter: %v %v", ok, err)
		}
		if r := d.Headers[idem.HeaderDeadLetterReason]; r != want[string(d.Body)] || d.Headers[idem.HeaderDeadLetterStatus] != "Rejected" {
			t.Errorf("dead letter %q: reason %v, status %v; want %s, Rejected", d.Body, r, d.Headers[idem.HeaderDeadLetterStatus], want[string(d.Body)])
		}
	}
}

// Many copies of one message ID in lease mode on two consumers: one
// effect, every copy settled, nothing dead-lettered.
func TestInProgressStorm(t *testing.T) {
	t.Parallel()
	conn := dial(t, "idem-test-storm")
	q, dead := queues(t, conn.Connection)
	var effects atomic.Int64
	lc, err := idem.NewLeaseConsumer(idem.NewMemoryStore(nil), idem.Config{Name: "storm", PurgeInterval: -1, Lease: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lc.Close() })
	p := idem.BindLease(lc, func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
		time.Sleep(300 * time.Millisecond)
		effects.Add(1)
		return idem.Result{}, nil
	})
	for range 2 {
		start(t, conn.Connection, idemamqp.Config{Processor: p, Queue: q, DeadLetter: dead, Concurrency: 4, Prefetch: 8, RetryDelay: 50 * time.Millisecond})
	}
	prod := idemamqp.NewProducer(conn.Connection, idemamqp.ProducerConfig{})
	defer prod.Close()
	const copies = 40
	for range copies {
		if _, err := prod.Publish(context.Background(), q, []byte("same"), idemamqp.WithMessageID("storm-1")); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 60*time.Second, "every copy settled", func() bool {
		return queueDepth(t, conn.Connection, q) == 0 && effects.Load() == 1
	}, nil)
	// Ready 0 may hide unacked copies: wait until a fresh consumer-less
	// count sees nothing for a while.
	time.Sleep(time.Second)
	if d := queueDepth(t, conn.Connection, q); d != 0 {
		t.Fatalf("%d copies left", d)
	}
	if n := effects.Load(); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	if d := queueDepth(t, conn.Connection, dead); d != 0 {
		t.Fatalf("%d dead letters, want 0", d)
	}
}

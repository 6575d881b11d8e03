package idemamqp_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemamqp"
	"github.com/idem-go/idem/store/idemsql"
	amqp "github.com/rabbitmq/amqp091-go"
	_ "modernc.org/sqlite"
)

// Adversarial tests: bad input, failing dependencies and lifecycle abuse.
// The invariant checked everywhere: a delivery that cannot be processed is
// never acked as done, and effects happen exactly once.

// A Processor that panics (a Processor wrapper, not a handler inside
// idem.Bind, whose panics the core recovers) does not crash the process:
// the delivery is not acked, and the redelivery is processed once.
func TestProcessorPanicIsNotAck(t *testing.T) {
	t.Parallel()
	conn := dial(t, "idem-test-panic")
	q, dead := queues(t, conn.Connection)
	e := newEffects()
	inner := txProcessor(t, e, nil)
	var calls atomic.Int64
	p := idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
		if calls.Add(1) == 1 {
			panic("middleware bug")
		}
		return inner.Process(ctx, msg)
	})
	start(t, conn.Connection, idemamqp.Config{Processor: p, Queue: q, DeadLetter: dead, RetryDelay: 100 * time.Millisecond})
	prod := idemamqp.NewProducer(conn.Connection, idemamqp.ProducerConfig{})
	defer prod.Close()
	if _, err := prod.Publish(context.Background(), q, []byte("x"), idemamqp.WithMessageID("m-1")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the message processed after the panic", func() bool {
		return e.snapshot()["m-1"] == 1 && queueDepth(t, conn.Connection, q) == 0
	})
	if calls.Load() != 2 {
		t.Fatalf("%d calls, want 2", calls.Load())
	}
	if n := queueDepth(t, conn.Connection, dead); n != 0 {
		t.Fatalf("%d dead letters, want 0", n)
	}
}

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
	start(t, conn.Connection, idemamqp.Config{Processor: p, Queue: q, DeadLetter: dead, RetryDelay: 100 * time.Millisecond})
	if err := rawPublish(context.Background(), conn.Connection, q, amqp.Publishing{Body: []byte("bad")}); err != nil {
		t.Fatal(err)
	}
	// Redelivered again and again: never acked.
	waitFor(t, 30*time.Second, "three attempts", func() bool { return calls.Load() >= 3 })
	// Make room: a new dead-letter queue of the same name without the limit.
	if _, err := ch.QueueDelete(dead, false, false, false); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(dead, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the dead letter", func() bool { return queueDepth(t, conn.Connection, dead) == 1 })
	waitFor(t, 30*time.Second, "the queue to drain", func() bool { return queueDepth(t, conn.Connection, q) == 0 })
}

// IDs that break idem's rules, in the message_id property and in a header
// (Config.IDHeader, where the 255-byte shortstr limit does not apply), and
// a header of another type: dead-lettered byte for byte with the reason;
// the good ones processed once.
func TestBadMessageIDs(t *testing.T) {
	t.Parallel()
	for _, where := range []string{"property", "header"} {
		t.Run(where, func(t *testing.T) {
			t.Parallel()
			conn := dial(t, "idem-test-bad-ids")
			q, dead := queues(t, conn.Connection)
			e := newEffects()
			cfg := idemamqp.Config{Processor: txProcessor(t, e, nil), Queue: q, DeadLetter: dead, Concurrency: 4, RetryDelay: 100 * time.Millisecond}
			if where == "header" {
				cfg.IDHeader = "x-msg-id"
			}
			start(t, conn.Connection, cfg)
			bad := []string{"a\nb", "nul\x00", "tab\t", "\xff\xfe", "del\x7f", "c1\u0085"}
			good := []string{strings.Repeat("y", 255), "été-🙂"}
			if where == "header" {
				bad = append(bad, strings.Repeat("x", 4000))
			}
			ctx := context.Background()
			for _, id := range append(append([]string{}, bad...), good...) {
				msg := amqp.Publishing{Body: []byte("p:" + id)}
				if where == "header" {
					msg.Headers = amqp.Table{"x-msg-id": id}
				} else {
					msg.MessageId = id
				}
				if err := rawPublish(ctx, conn.Connection, q, msg); err != nil {
					t.Fatal(err)
				}
			}
			if where == "header" { // a header of another type counts as missing
				if err := rawPublish(ctx, conn.Connection, q, amqp.Publishing{Body: []byte("typed"), Headers: amqp.Table{"x-msg-id": int64(42)}}); err != nil {
					t.Fatal(err)
				}
				bad = append(bad, "")
			}
			waitFor(t, 30*time.Second, "every message settled", func() bool {
				return queueDepth(t, conn.Connection, q) == 0 && queueDepth(t, conn.Connection, dead) == len(bad) && len(e.snapshot()) == len(good)
			})
			for _, id := range good {
				if n := e.snapshot()[id]; n != 1 {
					t.Errorf("good ID %q: %d effects, want 1", id, n)
				}
			}
			ch, err := conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			defer ch.Close()
			for range bad {
				d, ok, err := ch.Get(dead, true)
				if err != nil || !ok {
					t.Fatalf("get dead letter: %v %v", ok, err)
				}
				reason, _ := d.Headers[idemamqp.HeaderDeadLetterReason].(string)
				if d.Headers[idemamqp.HeaderDeadLetterStatus] != "Rejected" || reason == "" {
					t.Errorf("dead letter %q: headers %v", d.Body, d.Headers)
				}
				if string(d.Body) != "typed" && !strings.Contains(reason, "invalid message ID") {
					t.Errorf("dead letter %q: reason %q", d.Body, reason)
				}
			}
		})
	}
}

// openSQLite opens a SQLite database with idem's tables and an effects
// table.
func openSQLite(t *testing.T, path string) (*sql.DB, *idemsql.Store) {
	t.Helper()
	db, err := sql.Open("sqlite", idemsql.SQLiteDSN(path))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	st, err := idemsql.New(db, idemsql.SQLite, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS effects (id TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return db, st
}

func sqlProcessor(t *testing.T, st *idemsql.Store, attempts *atomic.Int64) idem.Processor {
	t.Helper()
	c, err := idem.NewConsumer(st, idem.Config{Name: "amqp-adv", PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
		if attempts != nil {
			attempts.Add(1)
		}
		return c.Process(ctx, msg, func(ctx context.Context, tx *sql.Tx, msg idem.Message) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO effects (id) VALUES (?)`, msg.ID)
			return err
		})
	})
}

// The store goes down under a running consumer (its *sql.DB closed):
// nothing is acked or dead-lettered, the messages come back; a member with
// a working store then processes each exactly once.
func TestStoreDownIsNotAck(t *testing.T) {
	t.Parallel()
	conn := dial(t, "idem-test-store-down")
	q, dead := queues(t, conn.Connection)
	path := filepath.Join(t.TempDir(), "idem.db")
	db1, st1 := openSQLite(t, path)
	var attempts atomic.Int64
	c1, res1 := start(t, conn.Connection, idemamqp.Config{Processor: sqlProcessor(t, st1, &attempts), Queue: q, DeadLetter: dead,
		Concurrency: 2, RetryDelay: 50 * time.Millisecond})
	_ = db1.Close()
	prod := idemamqp.NewProducer(conn.Connection, idemamqp.ProducerConfig{})
	defer prod.Close()
	const n = 5
	for i := range n {
		if _, err := prod.Publish(context.Background(), q, []byte("x"), idemamqp.WithMessageID(fmt.Sprint("m-", i))); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 30*time.Second, "several failed attempts per message", func() bool { return attempts.Load() >= 4*n })
	if err := c1.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-res1.done
	waitFor(t, 10*time.Second, "all messages back in the queue", func() bool { return queueDepth(t, conn.Connection, q) == n })
	if d := queueDepth(t, conn.Connection, dead); d != 0 {
		t.Fatalf("%d dead letters while the store was down, want 0", d)
	}
	db2, st2 := openSQLite(t, path)
	start(t, conn.Connection, idemamqp.Config{Processor: sqlProcessor(t, st2, nil), Queue: q, DeadLetter: dead, Concurrency: 2})
	waitFor(t, 30*time.Second, "the messages processed", func() bool { return queueDepth(t, conn.Connection, q) == 0 })
	var rows, distinct int
	waitFor(t, 10*time.Second, "the effects", func() bool {
		_ = db2.QueryRow(`SELECT COUNT(*), COUNT(DISTINCT id) FROM effects`).Scan(&rows, &distinct)
		return rows >= n
	})
	if rows != n || distinct != n {
		t.Fatalf("%d effect rows (%d distinct), want %d", rows, distinct, n)
	}
}

// Cancelling Run's context while a handler runs: the handler sees it, its
// transaction rolls back, the delivery is requeued, and the next consumer
// processes it once.
func TestContextCancelMidHandler(t *testing.T) {
	t.Parallel()
	conn := dial(t, "idem-test-cancel")
	q, dead := queues(t, conn.Connection)
	path := filepath.Join(t.TempDir(), "idem.db")
	_, st := openSQLite(t, path)
	c, err := idem.NewConsumer(st, idem.Config{Name: "amqp-adv", PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	entered := make(chan struct{})
	var once sync.Once
	p := idem.Bind(c, func(ctx context.Context, tx *sql.Tx, msg idem.Message) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO effects (id) VALUES (?)`, msg.ID); err != nil {
			return err
		}
		once.Do(func() { close(entered) })
		<-ctx.Done()
		return ctx.Err()
	})
	c1, err := idemamqp.NewConsumer(conn.Connection, idemamqp.Config{Processor: p, Queue: q, DeadLetter: dead, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c1.Run(ctx) }()
	<-c1.Ready()
	prod := idemamqp.NewProducer(conn.Connection, idemamqp.ProducerConfig{})
	defer prod.Close()
	if _, err := prod.Publish(context.Background(), q, []byte("x"), idemamqp.WithMessageID("m-1")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("handler not entered")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after cancel: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	waitFor(t, 10*time.Second, "the message back in the queue", func() bool { return queueDepth(t, conn.Connection, q) == 1 })
	db2, st2 := openSQLite(t, path)
	start(t, conn.Connection, idemamqp.Config{Processor: sqlProcessor(t, st2, nil), Queue: q, DeadLetter: dead})
	waitFor(t, 30*time.Second, "the message processed", func() bool { return queueDepth(t, conn.Connection, q) == 0 })
	var rows int
	waitFor(t, 10*time.Second, "one effect", func() bool {
		_ = db2.QueryRow(`SELECT COUNT(*) FROM effects`).Scan(&rows)
		return rows >= 1
	})
	if rows != 1 {
		t.Fatalf("%d effect rows, want 1", rows)
	}
}

// Stop before Run, Stop twice and concurrently, Run twice: the documented
// results, and no goroutine left behind once the connection is closed.
func TestLifecycleAbuse(t *testing.T) {
	setup := dial(t, "idem-test-lifecycle-setup")
	q, dead := queues(t, setup.Connection)
	ctx := context.Background()
	before := runtime.NumGoroutine()
	conn, err := dialTap(testURL(t), "idem-test-lifecycle")
	if err != nil {
		t.Fatal(err)
	}
	cfg := idemamqp.Config{Processor: txProcessor(t, newEffects(), nil), Queue: q, DeadLetter: dead, Logger: quiet()}

	c0, err := idemamqp.NewConsumer(conn.Connection, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c0.Stop(ctx); err != nil {
		t.Fatalf("Stop before Run: %v", err)
	}
	if err := c0.Stop(ctx); err != nil {
		t.Fatalf("second Stop before Run: %v", err)
	}
	runDone := make(chan error, 1)
	go func() { runDone <- c0.Run(ctx) }()
	select {
	case err := <-runDone:
		if err != nil {
			t.Fatalf("Run after Stop: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run after Stop did not return")
	}

	c1, err := idemamqp.NewConsumer(conn.Connection, cfg)
	if err != nil {
		t.Fatal(err)
	}
	go func() { runDone <- c1.Run(ctx) }()
	<-c1.Ready()
	if err := c1.Run(ctx); !errors.Is(err, idemamqp.ErrAlreadyRunning) {
		t.Fatalf("second Run: %v, want ErrAlreadyRunning", err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			if err := c1.Stop(sctx); err != nil {
				t.Errorf("concurrent Stop: %v", err)
			}
		})
	}
	wg.Wait()
	if err := <-runDone; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := c1.Run(ctx); !errors.Is(err, idemamqp.ErrAlreadyRunning) {
		t.Fatalf("Run after it returned: %v, want ErrAlreadyRunning", err)
	}
	if conn.IsClosed() {
		t.Fatal("the Consumer closed the caller's connection")
	}
	_ = conn.Close()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines after Stop and Close, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
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
	waitFor(t, 60*time.Second, "every copy settled", func() bool {
		return queueDepth(t, conn.Connection, q) == 0 && effects.Load() == 1
	})
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

// A payload of several megabytes is processed once, and an ID-less one is
// dead-lettered byte for byte.
func TestHugePayload(t *testing.T) {
	t.Parallel()
	conn := dial(t, "idem-test-huge")
	q, dead := queues(t, conn.Connection)
	e := newEffects()
	start(t, conn.Connection, idemamqp.Config{Processor: txProcessor(t, e, nil), Queue: q, DeadLetter: dead})
	big := []byte(strings.Repeat("0123456789abcdef", 8<<20/16))
	prod := idemamqp.NewProducer(conn.Connection, idemamqp.ProducerConfig{})
	defer prod.Close()
	if _, err := prod.Publish(context.Background(), q, big, idemamqp.WithMessageID("big")); err != nil {
		t.Fatal(err)
	}
	if err := rawPublish(context.Background(), conn.Connection, q, amqp.Publishing{Body: big}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "both settled", func() bool {
		return queueDepth(t, conn.Connection, q) == 0 && queueDepth(t, conn.Connection, dead) == 1 && e.snapshot()["big"] == 1
	})
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	d, ok, err := ch.Get(dead, true)
	if err != nil || !ok {
		t.Fatalf("get: %v %v", ok, err)
	}
	if string(d.Body) != string(big) {
		t.Fatalf("dead letter body of %d bytes, want the %d original bytes", len(d.Body), len(big))
	}
}

// In transactional mode a handler error marked idem.Permanent is not
// requeued for ever: the message is dead-lettered (its effects rolled
// back) and the others go on, as in the Kafka adapter.
func TestPermanentFailureTransactional(t *testing.T) {
	t.Parallel()
	conn := dial(t, "idem-test-permanent")
	q, dead := queues(t, conn.Connection)
	e := newEffects()
	var poisonCalls atomic.Int64
	p := txProcessor(t, e, func(ctx context.Context, msg idem.Message) error {
		if msg.ID == "poison" {
			poisonCalls.Add(1)
			return idem.Permanent(errors.New("amount is negative"))
		}
		return nil
	})
	start(t, conn.Connection, idemamqp.Config{Processor: p, Queue: q, DeadLetter: dead, RetryDelay: 50 * time.Millisecond})
	prod := idemamqp.NewProducer(conn.Connection, idemamqp.ProducerConfig{})
	defer prod.Close()
	for _, id := range []string{"a", "poison", "b"} {
		if _, err := prod.Publish(context.Background(), q, []byte(id), idemamqp.WithMessageID(id)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 30*time.Second, "the poison message dead-lettered", func() bool {
		return queueDepth(t, conn.Connection, dead) == 1 || poisonCalls.Load() > 5
	})
	if n := poisonCalls.Load(); n != 1 {
		t.Fatalf("the permanently failing handler ran %d times, want 1", n)
	}
	waitFor(t, 30*time.Second, "the queue drained", func() bool { return queueDepth(t, conn.Connection, q) == 0 && len(e.snapshot()) == 2 })
	if got := e.snapshot(); got["poison"] != 0 {
		t.Fatalf("effects %v", got)
	}
}

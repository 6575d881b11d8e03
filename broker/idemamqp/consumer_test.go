package idemamqp_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/idem-go/idem/internal/testenv"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemamqp"
	amqp "github.com/rabbitmq/amqp091-go"
)

// effects is a side-effect table: one entry per message ID, written in the
// claim's transaction, so a count above 1 is a double effect.
type effects struct {
	mu   sync.Mutex
	rows map[string]int
}

func newEffects() *effects { return &effects{rows: map[string]int{}} }

func (e *effects) add(id string) {
	e.mu.Lock()
	e.rows[id]++
	e.mu.Unlock()
}

func (e *effects) snapshot() map[string]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]int, len(e.rows))
	for k, v := range e.rows {
		out[k] = v
	}
	return out
}

// txProcessor returns a transactional-mode Processor on a MemoryStore
// whose handler writes one row per message to e (on commit) after calling
// before, if set.
func txProcessor(t *testing.T, e *effects, before func(ctx context.Context, msg idem.Message) error) idem.Processor {
	t.Helper()
	c, err := idem.NewConsumer(idem.NewMemoryStore(nil), idem.Config{Name: "amqp-test", PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return idem.Bind(c, func(ctx context.Context, tx *idem.MemoryTx, msg idem.Message) error {
		if before != nil {
			if err := before(ctx, msg); err != nil {
				return err
			}
		}
		tx.OnCommit(func() { e.add(msg.ID) })
		return nil
	})
}

// runResult is Run's result once it returned.
type runResult struct {
	done chan struct{}
	err  error
}

// start runs a Consumer until the test ends and waits until it consumes.
func start(t *testing.T, conn *amqp.Connection, cfg idemamqp.Config) (*idemamqp.Consumer, *runResult) {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet()
	}
	c, err := idemamqp.NewConsumer(conn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	res := &runResult{done: make(chan struct{})}
	go func() { res.err = c.Run(ctx); close(res.done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-res.done:
		case <-time.After(30 * time.Second):
			t.Error("Run did not return after its context ended")
		}
	})
	select {
	case <-c.Ready():
	case <-res.done:
		t.Fatalf("Run returned before consuming: %v", res.err)
	case <-time.After(30 * time.Second):
		t.Fatal("consumer not ready after 30s")
	}
	return c, res
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	conn := dial(t, "idem-test-config")
	p := idem.ProcessorFunc(func(context.Context, idem.Message) (idem.Outcome, error) {
		return idem.Outcome{Status: idem.Processed}, nil
	})
	ok := idemamqp.Config{Processor: p, Queue: "q", DeadLetter: "q.dead"}
	for name, mutate := range map[string]func(*idemamqp.Config){
		"no processor":             func(c *idemamqp.Config) { c.Processor = nil },
		"no queue":                 func(c *idemamqp.Config) { c.Queue = "" },
		"no dead letter":           func(c *idemamqp.Config) { c.DeadLetter = "" },
		"dead letter is the queue": func(c *idemamqp.Config) { c.DeadLetter = c.Queue },
		"negative concurrency":     func(c *idemamqp.Config) { c.Concurrency = -1 },
		"negative prefetch":        func(c *idemamqp.Config) { c.Prefetch = -1 },
		"prefetch below workers":   func(c *idemamqp.Config) { c.Concurrency, c.Prefetch = 4, 2 },
		"prefetch too large":       func(c *idemamqp.Config) { c.Prefetch = 70000 },
		"negative retry delay":     func(c *idemamqp.Config) { c.RetryDelay = -time.Second },
		"negative reconnect":       func(c *idemamqp.Config) { c.MaxReconnectInterval = -time.Second },
		"long consumer tag":        func(c *idemamqp.Config) { c.ConsumerTag = strings.Repeat("x", 256) },
	} {
		cfg := ok
		mutate(&cfg)
		if _, err := idemamqp.NewConsumer(conn.Connection, cfg); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("%s: NewConsumer error = %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := idemamqp.NewConsumer(nil, ok); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("nil connection: error = %v, want ErrInvalidConfig", err)
	}
	if _, err := idemamqp.NewConsumer(conn.Connection, ok); err != nil {
		t.Errorf("valid config: %v", err)
	}

	// amqp091's automatic recovery could ack stale delivery tags: refused.
	rec, err := amqp.DialConfig(testURL(t), amqp.Config{Recovery: &amqp.Recovery{}})
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close()
	if _, err := idemamqp.NewConsumer(rec, ok); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("connection with Recovery: error = %v, want ErrInvalidConfig", err)
	}

	closed := dial(t, "idem-test-closed")
	_ = closed.Close()
	if _, err := idemamqp.NewConsumer(closed.Connection, ok); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("closed connection: error = %v, want ErrInvalidConfig", err)
	}

	// Bad message IDs are refused by the producer before publishing.
	prod := idemamqp.NewProducer(conn.Connection, idemamqp.ProducerConfig{})
	defer prod.Close()
	if _, err := prod.Publish(context.Background(), "q", nil, idemamqp.WithMessageID("")); !errors.Is(err, idem.ErrMissingMessageID) {
		t.Errorf("empty WithMessageID: error = %v, want ErrMissingMessageID", err)
	}
	if _, err := prod.Publish(context.Background(), "q", nil, idemamqp.WithMessageID("a\x00b")); !errors.Is(err, idem.ErrInvalidMessageID) {
		t.Errorf("NUL in WithMessageID: error = %v, want ErrInvalidMessageID", err)
	}
}

// Run ends with an error, rather than retrying for ever, when the queue or
// the dead-letter queue does not exist.
func TestRunMissingQueues(t *testing.T) {
	t.Parallel()
	conn := dial(t, "idem-test-missing")
	q, dead := queues(t, conn.Connection)
	p := idem.ProcessorFunc(func(context.Context, idem.Message) (idem.Outcome, error) {
		return idem.Outcome{Status: idem.Processed}, nil
	})
	for name, cfg := range map[string]idemamqp.Config{
		"queue":       {Processor: p, Queue: q + ".missing", DeadLetter: dead},
		"dead letter": {Processor: p, Queue: q, DeadLetter: dead + ".missing"},
	} {
		cfg.Logger = quiet()
		c, err := idemamqp.NewConsumer(conn.Connection, cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = c.Run(ctx)
		cancel()
		var ae *amqp.Error
		if !errors.As(err, &ae) || ae.Code != amqp.NotFound {
			t.Errorf("missing %s: Run = %v, want an AMQP 404", name, err)
		}
		if err := c.Run(context.Background()); !errors.Is(err, idem.ErrAlreadyRunning) {
			t.Errorf("second Run = %v, want ErrAlreadyRunning", err)
		}
	}
	if conn.IsClosed() {
		t.Error("the caller's connection was closed")
	}
}

// Every outcome is settled as the package doc says: processed and duplicate
// acked, in-progress and failed requeued after their delay, rejected and
// mismatched dead-lettered with the original properties and the reason.
func TestOutcomeMapping(t *testing.T) {
	t.Parallel()
	conn := dial(t, "idem-test-outcomes")
	q, dead := queues(t, conn.Connection)

	var mu sync.Mutex
	seen := map[string][]time.Time{} // deliveries by payload
	p := idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
		mu.Lock()
		seen[string(msg.Payload)] = append(seen[string(msg.Payload)], time.Now())
		n := len(seen[string(msg.Payload)])
		mu.Unlock()
		switch string(msg.Payload) {
		case "in-progress":
			if n == 1 {
				return idem.Outcome{Status: idem.InProgress, Err: idem.ErrInProgress, RetryAfter: 700 * time.Millisecond}, idem.ErrInProgress
			}
		case "failed":
			if n == 1 {
				err := errors.New("store down")
				return idem.Outcome{Status: idem.Failed, Err: err}, err
			}
		case "no-status":
			if n == 1 {
				return idem.Outcome{}, errors.New("a broken processor")
			}
		case "mismatch":
			return idem.Outcome{Status: idem.FingerprintMismatch, Err: idem.ErrFingerprintMismatch}, idem.ErrFingerprintMismatch
		}
		if msg.ID == "" {
			return idem.Outcome{Status: idem.Rejected, Err: idem.ErrMissingMessageID}, idem.ErrMissingMessageID
		}
		return idem.Outcome{Status: idem.Processed, MessageID: msg.ID}, nil
	})
	start(t, conn.Connection, idemamqp.Config{Processor: p, Queue: q, DeadLetter: dead, Concurrency: 4, Prefetch: 8, RetryDelay: 400 * time.Millisecond})

	ctx := context.Background()
	prod := idemamqp.NewProducer(conn.Connection, idemamqp.ProducerConfig{})
	defer prod.Close()
	published := map[string]time.Time{}
	for _, payload := range []string{"in-progress", "failed", "no-status", "mismatch", "ok"} {
		published[payload] = time.Now()
		if _, err := prod.Publish(ctx, q, []byte(payload), idemamqp.WithContentType("text/plain")); err != nil {
			t.Fatal(err)
		}
	}
	published["no-id"] = time.Now()
	if err := rawPublish(ctx, conn.Connection, q, amqp.Publishing{Body: []byte("no-id"), Type: "payment", Headers: amqp.Table{"trace": "t-1"}}); err != nil {
		t.Fatal(err)
	}

	testenv.Eventually(t, 30*time.Second, "every message settled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen["in-progress"]) >= 2 && len(seen["failed"]) >= 2 && len(seen["no-status"]) >= 2 &&
			len(seen["ok"]) >= 1 && len(seen["mismatch"]) >= 1 && len(seen["no-id"]) >= 1 &&
			queueDepth(t, conn.Connection, dead) == 2 && queueDepth(t, conn.Connection, q) == 0
	}, nil)
	mu.Lock()
	for payload, min := range map[string]time.Duration{"in-progress": 700 * time.Millisecond, "failed": 400 * time.Millisecond, "no-status": 400 * time.Millisecond} {
		if gap := seen[payload][1].Sub(seen[payload][0]); gap < min {
			t.Errorf("%s redelivered after %v, want at least %v", payload, gap, min)
		}
		if len(seen[payload]) != 2 {
			t.Errorf("%s delivered %d times, want 2", payload, len(seen[payload]))
		}
	}
	for _, payload := range []string{"ok", "mismatch", "no-id"} {
		if len(seen[payload]) != 1 {
			t.Errorf("%s delivered %d times, want 1", payload, len(seen[payload]))
		}
	}
	mu.Unlock()

	// The dead letters keep body and properties and carry the reason.
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	got := map[string]amqp.Delivery{}
	for range 2 {
		d, ok, err := ch.Get(dead, true)
		if err != nil || !ok {
			t.Fatalf("get dead letter: ok=%v err=%v", ok, err)
		}
		got[string(d.Body)] = d
	}
	noID := got["no-id"]
	if noID.Headers[idem.HeaderDeadLetterReason] != idem.ReasonMissingMessageID ||
		noID.Headers[idem.HeaderDeadLetterError] != idem.ErrMissingMessageID.Error() ||
		noID.Headers[idem.HeaderDeadLetterStatus] != "Rejected" ||
		noID.Headers[idemamqp.HeaderOriginalQueue] != q ||
		noID.Headers[idem.HeaderOriginalMessageID] != nil ||
		noID.Headers["trace"] != "t-1" || noID.Type != "payment" || noID.MessageId != "" ||
		noID.DeliveryMode != amqp.Persistent {
		t.Errorf("dead letter of the ID-less message: %+v", noID)
	}
	mm := got["mismatch"]
	if mm.Headers[idem.HeaderDeadLetterStatus] != "FingerprintMismatch" || mm.Headers[idem.HeaderDeadLetterReason] != idem.ReasonFingerprintMismatch ||
		mm.MessageId == "" || mm.Headers[idem.HeaderOriginalMessageID] != mm.MessageId || mm.ContentType != "text/plain" {
		t.Errorf("dead letter of the mismatch: %+v", mm)
	}
}

// A dead letter that cannot be routed (its queue was deleted) is not acked:
// the message stays in the queue and is dead-lettered once the dead-letter
// queue is back.
func TestDeadLetterUnroutable(t *testing.T) {
	t.Parallel()
	conn := dial(t, "idem-test-unroutable")
	q, dead := queues(t, conn.Connection)
	var deliveries atomic.Int64
	p := idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
		deliveries.Add(1)
		return idem.Outcome{Status: idem.Rejected, Err: idem.ErrMissingMessageID}, idem.ErrMissingMessageID
	})
	start(t, conn.Connection, idemamqp.Config{Processor: p, Queue: q, DeadLetter: dead, RetryDelay: 100 * time.Millisecond})
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if _, err := ch.QueueDelete(dead, false, false, false); err != nil {
		t.Fatal(err)
	}
	if err := rawPublish(context.Background(), conn.Connection, q, amqp.Publishing{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "three attempts", func() bool { return deliveries.Load() >= 3 }, nil)
	if _, err := ch.QueueDeclare(dead, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the dead letter", func() bool { return queueDepth(t, conn.Connection, dead) == 1 }, nil)
	testenv.Eventually(t, 30*time.Second, "the queue to drain", func() bool { return queueDepth(t, conn.Connection, q) == 0 }, nil)
}

// Stop waits for the handlers in flight, acks what they finished, and
// requeues what was prefetched but not started.
func TestStopGraceful(t *testing.T) {
	t.Parallel()
	conn := dial(t, "idem-test-stop")
	q, dead := queues(t, conn.Connection)
	e := newEffects()
	entered := make(chan string, 10)
	release := make(chan struct{})
	p := txProcessor(t, e, func(ctx context.Context, msg idem.Message) error {
		entered <- msg.ID
		<-release
		return nil
	})
	c, done := start(t, conn.Connection, idemamqp.Config{Processor: p, Queue: q, DeadLetter: dead, Concurrency: 2, Prefetch: 4})
	prod := idemamqp.NewProducer(conn.Connection, idemamqp.ProducerConfig{})
	defer prod.Close()
	for i := range 6 {
		if _, err := prod.Publish(context.Background(), q, []byte("x"), idemamqp.WithMessageID(fmt.Sprint("m-", i))); err != nil {
			t.Fatal(err)
		}
	}
	<-entered
	<-entered
	stopped := make(chan error, 1)
	go func() { stopped <- c.Stop(context.Background()) }()
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned (%v) with handlers in flight", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("Stop: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Stop did not return")
	}
	<-done.done
	if done.err != nil {
		t.Fatalf("Run after Stop = %v, want nil", done.err)
	}
	if n := len(e.snapshot()); n != 2 {
		t.Fatalf("%d messages processed, want the 2 in flight", n)
	}
	// The two finished were acked; the other four are back in the queue.
	testenv.Eventually(t, 10*time.Second, "4 messages back in the queue", func() bool { return queueDepth(t, conn.Connection, q) == 4 }, nil)
	if conn.IsClosed() {
		t.Error("Stop closed the caller's connection")
	}
}

// The connection is lost while messages are in flight; the Consumer
// redials and every message is processed exactly once. Lost by cutting the
// TCP socket, and (when rabbitmqctl can reach the node) by a forced close
// from the server.
func TestReconnect(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"socket-cut", "rabbitmqctl-close"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			testReconnect(t, how)
		})
	}
}

func testReconnect(t *testing.T, how string) {
	admin := dial(t, "idem-test-reconnect-admin")
	q, dead := queues(t, admin.Connection)
	name := randName("idem-test-reconnect-")
	var killer func(*tapConn) error
	switch how {
	case "socket-cut":
		killer = func(c *tapConn) error { c.cut(); return nil }
	case "rabbitmqctl-close":
		if err := rabbitmqctl("list_connections", "name"); err != nil {
			if testenv.Required() {
				t.Fatalf("rabbitmqctl cannot reach the node (%v); set RABBITMQ_NODENAME", err)
			}
			t.Skipf("rabbitmqctl cannot reach the node (%v); set RABBITMQ_NODENAME", err)
		}
		killer = func(*tapConn) error { return closeByName(name) }
	}

	var mu sync.Mutex
	var conns []*tapConn
	redial := func(ctx context.Context) (*amqp.Connection, error) {
		c, err := dialTap(testURL(t), name)
		if err != nil {
			return nil, err
		}
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
		return c.Connection, nil
	}
	first, err := dialTap(testURL(t), name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = first.Close() })

	e := newEffects()
	const n = 40
	var count atomic.Int64
	gate := make(chan struct{})   // closed when a quarter of the messages ran
	killed := make(chan struct{}) // closed once the connection is gone
	var gateOnce sync.Once
	p := txProcessor(t, e, func(ctx context.Context, msg idem.Message) error {
		if count.Add(1) >= n/4 {
			gateOnce.Do(func() { close(gate) })
			<-killed // in flight while the connection goes
		}
		return nil
	})
	_, done := start(t, first.Connection, idemamqp.Config{
		Processor: p, Queue: q, DeadLetter: dead, Concurrency: 4, RetryDelay: 100 * time.Millisecond,
		Redial: redial, MaxReconnectInterval: time.Second,
	})
	prod := idemamqp.NewProducer(admin.Connection, idemamqp.ProducerConfig{})
	defer prod.Close()
	for i := range n {
		if _, err := prod.Publish(context.Background(), q, []byte("x"), idemamqp.WithMessageID(fmt.Sprint("r-", i))); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-gate:
	case <-time.After(30 * time.Second):
		t.Fatal("nothing processed")
	}
	if err := killer(first); err != nil {
		t.Fatalf("close the connection: %v", err)
	}
	testenv.Eventually(t, 30*time.Second, "the connection to close", first.IsClosed, nil)
	close(killed)
	testenv.Eventually(t, 60*time.Second, "every message processed", func() bool {
		return len(e.snapshot()) == n && queueDepth(t, admin.Connection, q) == 0
	}, nil)
	for id, c := range e.snapshot() {
		if c != 1 {
			t.Errorf("%s: %d effects", id, c)
		}
	}
	mu.Lock()
	redials := len(conns)
	mu.Unlock()
	if redials == 0 {
		t.Error("the consumer never redialled")
	}
	if !first.IsClosed() {
		t.Error("the first connection is still open")
	}
	select {
	case <-done.done:
		t.Fatalf("Run returned %v after a reconnect", done.err)
	default:
	}
}

// rabbitmqctl runs rabbitmqctl against the node named by RABBITMQ_NODENAME
// (default idem@localhost, the node scripts/services starts).
func rabbitmqctl(args ...string) error {
	node := os.Getenv("RABBITMQ_NODENAME")
	if node == "" {
		node = "idem@localhost"
	}
	path, err := exec.LookPath("rabbitmqctl")
	if err != nil {
		return err
	}
	out, err := exec.Command(path, append([]string{"-n", node, "-q"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	return nil
}

// closeByName force-closes, from the server, the connections whose client
// name is name.
func closeByName(name string) error {
	path, _ := exec.LookPath("rabbitmqctl")
	node := os.Getenv("RABBITMQ_NODENAME")
	if node == "" {
		node = "idem@localhost"
	}
	out, err := exec.Command(path, "-n", node, "-q", "list_connections", "pid", "client_properties").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	closed := 0
	for line := range strings.SplitSeq(string(out), "\n") {
		if !strings.Contains(line, name) {
			continue
		}
		pid := strings.Fields(line)[0]
		if err := rabbitmqctl("close_connection", pid, "idem test: forced close"); err != nil {
			return err
		}
		closed++
	}
	if closed == 0 {
		return fmt.Errorf("no connection named %s", name)
	}
	return nil
}

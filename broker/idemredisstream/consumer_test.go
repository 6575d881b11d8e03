package idemredisstream_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/idem-go/idem/internal/testenv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemredisstream"
	"github.com/redis/go-redis/v9"
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

// txProcessor returns a transactional-mode Processor on store whose
// handler calls before, if set, then writes one row per message to e on
// commit.
func txProcessor(t *testing.T, store *idem.MemoryStore, e *effects, before func(ctx context.Context, msg idem.Message) error) idem.Processor {
	t.Helper()
	c, err := idem.NewConsumer(store, idem.Config{Name: "redis-stream-test", PurgeInterval: -1})
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

type runResult struct {
	done chan struct{}
	err  error
}

// start runs a Consumer on its own client until the test ends, and waits
// until it reads. The client is returned so a test can close it (a crash).
func start(t *testing.T, cfg idemredisstream.Config) (*idemredisstream.Consumer, *redis.Client, *runResult) {
	t.Helper()
	rdb := newClient(t)
	if cfg.Logger == nil {
		cfg.Logger = quiet()
	}
	if cfg.Block == 0 {
		cfg.Block = 200 * time.Millisecond
	}
	c, err := idemredisstream.NewConsumer(rdb, cfg)
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
		_ = rdb.Close()
	})
	select {
	case <-c.Ready():
	case <-res.done:
		t.Fatalf("Run returned before reading: %v", res.err)
	case <-time.After(30 * time.Second):
		t.Fatal("consumer not ready after 30s")
	}
	return c, rdb, res
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	rdb := client(t)
	p := idem.ProcessorFunc(func(context.Context, idem.Message) (idem.Outcome, error) {
		return idem.Outcome{Status: idem.Processed}, nil
	})
	ok := idemredisstream.Config{Processor: p, Stream: "s", Group: "g", Consumer: "c", DeadLetter: "s:dead"}
	for name, mutate := range map[string]func(*idemredisstream.Config){
		"no processor":              func(c *idemredisstream.Config) { c.Processor = nil },
		"no stream":                 func(c *idemredisstream.Config) { c.Stream = "" },
		"no group":                  func(c *idemredisstream.Config) { c.Group = "" },
		"no consumer":               func(c *idemredisstream.Config) { c.Consumer = "" },
		"no dead letter":            func(c *idemredisstream.Config) { c.DeadLetter = "" },
		"dead letter is the stream": func(c *idemredisstream.Config) { c.DeadLetter = c.Stream },
		"same id and payload field": func(c *idemredisstream.Config) { c.IDField, c.PayloadField = "x", "x" },
		"negative concurrency":      func(c *idemredisstream.Config) { c.Concurrency = -1 },
		"min idle too short":        func(c *idemredisstream.Config) { c.MinIdle = time.Millisecond },
		"negative claim interval":   func(c *idemredisstream.Config) { c.ClaimInterval = -1 },
		"negative retry delay":      func(c *idemredisstream.Config) { c.RetryDelay = -1 },
		"negative block":            func(c *idemredisstream.Config) { c.Block = -1 },
		"negative max deliveries":   func(c *idemredisstream.Config) { c.MaxDeliveries = -1 },
		"processor and batch processor": func(c *idemredisstream.Config) {
			c.BatchProcessor = idem.BindBatch[*idem.MemoryTx](nil, nil)
		},
		"negative batch size": func(c *idemredisstream.Config) {
			c.Processor, c.BatchProcessor, c.BatchSize = nil, idem.BindBatch[*idem.MemoryTx](nil, nil), -1
		},
	} {
		cfg := ok
		mutate(&cfg)
		if _, err := idemredisstream.NewConsumer(rdb, cfg); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("%s: NewConsumer error = %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := idemredisstream.NewConsumer(nil, ok); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("nil client: error = %v, want ErrInvalidConfig", err)
	}
	c, err := idemredisstream.NewConsumer(rdb, ok)
	if err != nil {
		t.Fatalf("valid config: %v", err)
	}
	// Stop before Run: Run returns at once; a second Run is refused.
	if err := c.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	stream, dead := keys(t)
	c, err = idemredisstream.NewConsumer(rdb, idemredisstream.Config{Processor: p, Stream: stream, Group: "g", Consumer: "c", DeadLetter: dead})
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Stop(context.Background())
	if err := c.Run(context.Background()); err != nil {
		t.Errorf("Run after Stop = %v, want nil", err)
	}
	if err := c.Run(context.Background()); !errors.Is(err, idem.ErrAlreadyRunning) {
		t.Errorf("second Run = %v, want ErrAlreadyRunning", err)
	}

	prod := idemredisstream.NewProducer(rdb, idemredisstream.ProducerConfig{})
	if _, err := prod.Publish(context.Background(), stream, nil, idemredisstream.WithMessageID("")); !errors.Is(err, idem.ErrMissingMessageID) {
		t.Errorf("empty WithMessageID: error = %v, want ErrMissingMessageID", err)
	}
	if _, err := prod.Publish(context.Background(), stream, nil, idemredisstream.WithMessageID("a\nb")); !errors.Is(err, idem.ErrInvalidMessageID) {
		t.Errorf("newline in WithMessageID: error = %v, want ErrInvalidMessageID", err)
	}

	// A client that is closed ends Run with an error.
	closed := newClient(t)
	_ = closed.Close()
	c, err = idemredisstream.NewConsumer(closed, idemredisstream.Config{Processor: p, Stream: stream, Group: "g", Consumer: "c", DeadLetter: dead})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Run(context.Background()); !errors.Is(err, redis.ErrClosed) {
		t.Errorf("Run on a closed client = %v, want redis.ErrClosed", err)
	}
}

// Every outcome is settled as the package doc says: processed and
// duplicate acked; in-progress and failed left pending and reclaimed after
// their delay (not after MinIdle); rejected and mismatched dead-lettered
// with the original fields and the reason, and acked.
func TestOutcomeMapping(t *testing.T) {
	t.Parallel()
	stream, dead := keys(t)
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
	// MinIdle is far above the delays: a redelivery before it shows that
	// the delay was applied with XCLAIM IDLE.
	const minIdle = 20 * time.Second
	_, _, _ = start(t, idemredisstream.Config{Processor: p, Stream: stream, Group: "g", Consumer: "c1", DeadLetter: dead,
		Concurrency: 4, MinIdle: minIdle, RetryDelay: 400 * time.Millisecond, ClaimInterval: 50 * time.Millisecond})

	ctx := context.Background()
	rdb := client(t)
	prod := idemredisstream.NewProducer(rdb, idemredisstream.ProducerConfig{})
	began := time.Now()
	for _, payload := range []string{"in-progress", "failed", "no-status", "mismatch", "ok"} {
		if _, err := prod.Publish(ctx, stream, []byte(payload), idemredisstream.WithFields(map[string]string{"trace": "t-" + payload})); err != nil {
			t.Fatal(err)
		}
	}
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"payload", "no-id", "trace", "t-no-id"}}).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 15*time.Second, "every entry settled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen["in-progress"]) >= 2 && len(seen["failed"]) >= 2 && len(seen["no-status"]) >= 2 &&
			len(seen["ok"]) >= 1 && len(seen["mismatch"]) >= 1 && len(seen["no-id"]) >= 1 &&
			pendingCount(t, rdb, stream, "g") == 0
	}, nil)
	if time.Since(began) >= minIdle {
		t.Fatalf("settling took %v, not less than MinIdle", time.Since(began))
	}
	mu.Lock()
	for payload, least := range map[string]time.Duration{"in-progress": 700 * time.Millisecond, "failed": 400 * time.Millisecond, "no-status": 400 * time.Millisecond} {
		if gap := seen[payload][1].Sub(seen[payload][0]); gap < least-50*time.Millisecond {
			t.Errorf("%s redelivered after %v, want about %v", payload, gap, least)
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

	entries, err := rdb.XRange(ctx, dead, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 {
		t.Fatalf("%d dead letters, want 2: %v", len(entries), entries)
	}
	for _, e := range entries {
		v := e.Values
		switch v["payload"] {
		case "no-id":
			if v[idem.HeaderDeadLetterReason] != idem.ReasonMissingMessageID || v[idem.HeaderDeadLetterError] != idem.ErrMissingMessageID.Error() ||
				v[idem.HeaderDeadLetterStatus] != "Rejected" || v[idem.HeaderOriginalMessageID] != nil ||
				v["trace"] != "t-no-id" || v[idemredisstream.FieldOriginalStream] != stream || v[idemredisstream.FieldOriginalEntry] == nil {
				t.Errorf("dead letter of the ID-less entry: %v", v)
			}
			if _, ok := v["message-id"]; ok {
				t.Errorf("dead letter of the ID-less entry has a message-id: %v", v)
			}
		case "mismatch":
			if v[idem.HeaderDeadLetterStatus] != "FingerprintMismatch" || v[idem.HeaderDeadLetterReason] != idem.ReasonFingerprintMismatch ||
				v["message-id"] == "" || v[idem.HeaderOriginalMessageID] != v["message-id"] || v["trace"] != "t-mismatch" {
				t.Errorf("dead letter of the mismatch: %v", v)
			}
		default:
			t.Errorf("unexpected dead letter %v", v)
		}
	}
}

// A member reads entries and crashes (its client closed) with them in
// flight, its effects half committed; the other member reclaims them with
// XAUTOCLAIM after MinIdle, not before, and every message has one effect.
func TestAutoClaimAfterCrash(t *testing.T) {
	t.Parallel()
	stream, dead := keys(t)
	store := idem.NewMemoryStore(nil)
	e := newEffects()
	const n = 20
	const minIdle = 1500 * time.Millisecond

	// Member 1 commits the effects of its first half; the transactions of
	// the second half roll back (as a crash mid-transaction does). Then it
	// hangs before settling anything, and is crashed while it hangs.
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	var entered atomic.Int64
	p1 := txProcessor(t, store, e, func(ctx context.Context, msg idem.Message) error {
		entered.Add(1)
		if msg.ID >= "m-10" {
			return errors.New("crashed mid-transaction")
		}
		return nil
	})
	var afterCrash, early atomic.Int64
	var crashedAt atomic.Int64
	p2 := txProcessor(t, store, e, func(ctx context.Context, msg idem.Message) error {
		if crashedAt.Load() == 0 {
			early.Add(1)
			return errors.New("member 2 got a message before member 1 crashed")
		}
		afterCrash.Add(1)
		return nil
	})
	rdb := client(t)
	prod := idemredisstream.NewProducer(rdb, idemredisstream.ProducerConfig{})
	for i := range n {
		if _, err := prod.Publish(context.Background(), stream, []byte("x"), idemredisstream.WithMessageID(fmt.Sprintf("m-%02d", i))); err != nil {
			t.Fatal(err)
		}
	}
	// Member 1 takes all n (concurrency n), XACKs nothing: its acks are
	// dropped by a processor wrapper that hangs after the commit.
	_, c1, _ := start(t, idemredisstream.Config{Processor: idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
		out, err := p1.Process(ctx, msg)
		select { // commit done; die before the ack
		case <-hang:
		case <-ctx.Done():
		}
		return out, err
	}), Stream: stream, Group: "g", Consumer: "m1", DeadLetter: dead, Concurrency: n, MinIdle: minIdle})
	testenv.Eventually(t, 15*time.Second, "member 1 to take every entry", func() bool { return entered.Load() == n }, nil)
	if got := len(e.snapshot()); got != n/2 {
		t.Fatalf("%d effects before the crash, want %d", got, n/2)
	}
	// Member 2 joins; nothing is idle yet, so it gets nothing until the crash.
	_, _, _ = start(t, idemredisstream.Config{Processor: p2, Stream: stream, Group: "g", Consumer: "m2", DeadLetter: dead,
		Concurrency: 4, MinIdle: minIdle, ClaimInterval: 100 * time.Millisecond})
	time.Sleep(minIdle + 500*time.Millisecond) // member 1's keep-alive holds its entries
	// The freshest entry's idle time by Redis's clock, just before the
	// crash: member 1's keep-alive resets it every MinIdle/3, unless the
	// machine was too loaded to run it on time. Every entry is reclaimed
	// only once it has been idle MinIdle, so not before MinIdle minus that.
	read := time.Now()
	fresh := minPendingIdle(t, rdb, stream, "g")
	crashedAt.Store(time.Now().UnixNano())
	_ = c1.Close()

	testenv.Eventually(t, 30*time.Second, "member 2 to reclaim and settle everything", func() bool {
		return pendingCount(t, rdb, stream, "g") == 0
	}, nil)
	if took := time.Since(read); took < minIdle-fresh-reclaimSlack {
		t.Errorf("reclaimed %v after the crash, with the freshest entry idle %v then: before MinIdle %v could pass", took, fresh, minIdle)
	}
	for i := range n {
		id := fmt.Sprintf("m-%02d", i)
		if c := e.snapshot()[id]; c != 1 {
			t.Errorf("%s: %d effects, want 1", id, c)
		}
	}
	if got := early.Load(); got != 0 {
		t.Errorf("member 2 got %d entries while member 1 was alive and kept them", got)
	}
	if got := afterCrash.Load(); got != n/2 {
		t.Errorf("member 2 ran %d handlers, want the %d uncommitted (the rest are duplicates)", got, n/2)
	}
	if dl, _ := rdb.XLen(context.Background(), dead).Result(); dl != 0 {
		t.Errorf("%d dead letters, want 0", dl)
	}
}

// With MaxDeliveries, an entry that keeps failing is dead-lettered with
// idem.ErrTooManyDeliveries after that many deliveries.
func TestMaxDeliveries(t *testing.T) {
	t.Parallel()
	stream, dead := keys(t)
	var runs atomic.Int64
	p := idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
		runs.Add(1)
		err := errors.New("always fails")
		return idem.Outcome{Status: idem.Failed, MessageID: msg.ID, Err: err}, err
	})
	_, _, _ = start(t, idemredisstream.Config{Processor: p, Stream: stream, Group: "g", Consumer: "c", DeadLetter: dead,
		MinIdle: time.Second, RetryDelay: 50 * time.Millisecond, ClaimInterval: 20 * time.Millisecond, MaxDeliveries: 3})
	rdb := client(t)
	if _, err := idemredisstream.NewProducer(rdb, idemredisstream.ProducerConfig{}).Publish(context.Background(), stream, []byte("x"), idemredisstream.WithMessageID("poison")); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the dead letter", func() bool {
		n, _ := rdb.XLen(context.Background(), dead).Result()
		return n == 1
	}, nil)
	if got := runs.Load(); got != 3 {
		t.Errorf("processed %d times, want 3", got)
	}
	dl, err := readDeadLetters(context.Background(), rdb, dead)
	if err != nil {
		t.Fatal(err)
	}
	if dl[0].ID != "poison" || dl[0].Reason != idem.ReasonTooManyDeliveries || !strings.Contains(dl[0].Error, idem.ErrTooManyDeliveries.Error()) {
		t.Errorf("dead letter %+v", dl[0])
	}
	if pendingCount(t, rdb, stream, "g") != 0 {
		t.Error("the entry is still pending")
	}
}

// Stop waits for the handlers in flight and XACKs them.
func TestStopGraceful(t *testing.T) {
	t.Parallel()
	stream, dead := keys(t)
	e := newEffects()
	entered := make(chan string, 10)
	release := make(chan struct{})
	p := txProcessor(t, idem.NewMemoryStore(nil), e, func(ctx context.Context, msg idem.Message) error {
		entered <- msg.ID
		<-release
		return nil
	})
	c, _, res := start(t, idemredisstream.Config{Processor: p, Stream: stream, Group: "g", Consumer: "c", DeadLetter: dead, Concurrency: 2})
	rdb := client(t)
	prod := idemredisstream.NewProducer(rdb, idemredisstream.ProducerConfig{})
	for i := range 6 {
		if _, err := prod.Publish(context.Background(), stream, []byte("x"), idemredisstream.WithMessageID(fmt.Sprint("m-", i))); err != nil {
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
	<-res.done
	if res.err != nil {
		t.Fatalf("Run after Stop = %v, want nil", res.err)
	}
	if n := len(e.snapshot()); n != 2 {
		t.Fatalf("%d messages processed, want the 2 in flight", n)
	}
	if got := pendingCount(t, rdb, stream, "g"); got != 0 {
		t.Errorf("%d entries pending after Stop, want 0", got)
	}
	info, err := rdb.XInfoGroups(context.Background(), stream).Result()
	if err != nil || len(info) != 1 || info[0].Lag != 4 {
		t.Errorf("group after Stop: %+v %v, want 4 entries not yet read", info, err)
	}
}

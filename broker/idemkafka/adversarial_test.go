package idemkafka

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idemsql"
)

// Adversarial tests: bad input, failing dependencies and lifecycle abuse.
// The invariant checked everywhere: a record that cannot be processed is
// never committed as done, and effects happen exactly once.

// effectsTable adds the side-effect table to a database from openSQLite.
func effectsTable(t *testing.T, db *sql.DB) {
	t.Helper()
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS effects (id TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
}

// sqlProcessor is idem.Bind over st with a handler that writes one effect
// row in the claim's transaction, after calling before (if set).
func sqlProcessor(t *testing.T, st *idemsql.Store, before func(ctx context.Context, msg idem.Message) error) idem.Processor {
	t.Helper()
	c, err := idem.NewConsumer(st, idem.Config{Name: "kafka-adv", PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return idem.Bind(c, func(ctx context.Context, tx *sql.Tx, msg idem.Message) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO effects (id) VALUES (?)`, msg.ID); err != nil {
			return err
		}
		if before != nil {
			return before(ctx, msg)
		}
		return nil
	})
}

func effectRows(t *testing.T, db *sql.DB) (rows, distinct int) {
	t.Helper()
	if err := db.QueryRow(`SELECT COUNT(*), COUNT(DISTINCT id) FROM effects`).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	return rows, distinct
}

// A Processor that panics (a wrapper, not a handler inside idem.Bind) does
// not crash the process and its record is not committed; the retry
// processes it once.
func TestProcessorPanicIsNotCommitted(t *testing.T) {
	t.Parallel()
	topic, dead, group := uniqueName("panic"), uniqueName("panic-dead"), uniqueName("panic-group")
	seeds := newCluster(t, topic, dead).ListenAddrs()
	db, st := openSQLite(t)
	effectsTable(t, db)
	inner := sqlProcessor(t, st, nil)
	var calls atomic.Int64
	proc := idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
		if calls.Add(1) == 1 {
			panic("middleware bug")
		}
		return inner.Process(ctx, msg)
	})
	startMember(t, seeds, group, topic, Config{Processor: proc, DeadLetter: dead, RetryDelay: 50 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if _, err := NewProducer(newClient(t, seeds), ProducerConfig{}).Publish(ctx, topic, []byte("x"), WithMessageID("m-1")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the record processed and committed", func() bool {
		rows, _ := effectRows(t, db)
		return rows == 1 && groupLag(t, seeds, group, topic) == 0
	}, func() string { return fmt.Sprintf("%d calls", calls.Load()) })
	if rows, _ := effectRows(t, db); rows != 1 || calls.Load() != 2 {
		t.Fatalf("%d effects after %d calls, want 1 after 2", rows, calls.Load())
	}
}

// Message IDs that break idem's rules, through the real Idempotent
// Consumer: control characters, over 255 bytes, not UTF-8, and the ID
// header twice with different values are dead-lettered with the reason and
// committed; the same value twice, 255 bytes and non-ASCII IDs are
// processed once.
func TestBadMessageIDs(t *testing.T) {
	t.Parallel()
	topic, dead, group := uniqueName("badid"), uniqueName("badid-dead"), uniqueName("badid-group")
	seeds := newCluster(t, topic, dead).ListenAddrs()
	raw := newClient(t, seeds)
	db, st := openSQLite(t)
	effectsTable(t, db)
	startMember(t, seeds, group, topic, Config{Processor: sqlProcessor(t, st, nil), DeadLetter: dead, Concurrency: 4, RetryDelay: 50 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	produce := func(value string, ids ...string) {
		t.Helper()
		var hs []kgo.RecordHeader
		for _, id := range ids {
			hs = append(hs, kgo.RecordHeader{Key: DefaultIDHeader, Value: []byte(id)})
		}
		if err := raw.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte(value), Headers: hs}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	bad := []string{"a\nb", "nul\x00", "tab\t", strings.Repeat("x", 256), "\xff\xfe", "del\x7f", "c1\u0085"}
	for i, id := range bad {
		produce(fmt.Sprint("bad-", i), id)
	}
	produce("two-values", "first", "second")
	good := []string{strings.Repeat("y", 255), "été-🙂"}
	for _, id := range good {
		produce("good", id)
	}
	produce("same-twice", "twice", "twice")
	good = append(good, "twice")
	wantDead := len(bad) + 1
	eventually(t, "every record settled and committed", func() bool {
		return groupLag(t, seeds, group, topic) == 0
	}, func() string { return fmt.Sprintf("lag %d", groupLag(t, seeds, group, topic)) })
	rows, distinct := effectRows(t, db)
	if rows != len(good) || distinct != len(good) {
		t.Errorf("%d effect rows (%d distinct), want %d", rows, distinct, len(good))
	}
	recs, err := deadLetters(ctx, seeds, dead)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != wantDead {
		t.Fatalf("%d dead letters, want %d", len(recs), wantDead)
	}
	for _, r := range recs {
		reason := header(r, HeaderDeadLetterReason)
		if header(r, HeaderDeadLetterStatus) != "Rejected" || !strings.Contains(reason, "invalid message ID") {
			t.Errorf("dead letter %q: status %q reason %q", r.Value, header(r, HeaderDeadLetterStatus), reason)
		}
	}
}

// The store goes down under a running member (its *sql.DB closed): no
// offset is committed and nothing is dead-lettered; a member with a
// working store then processes every record exactly once.
func TestStoreDownIsNotCommitted(t *testing.T) {
	t.Parallel()
	topic, dead, group := uniqueName("storedown"), uniqueName("storedown-dead"), uniqueName("storedown-group")
	seeds := newCluster(t, topic, dead).ListenAddrs()
	db1, st1 := openSQLite(t)
	effectsTable(t, db1)
	var attempts atomic.Int64
	counting := sqlProcessor(t, st1, nil)
	proc := idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
		attempts.Add(1)
		return counting.Process(ctx, msg)
	})
	m1 := startMember(t, seeds, group, topic, Config{Processor: proc, DeadLetter: dead, Concurrency: 4, RetryDelay: 50 * time.Millisecond})
	_ = db1.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	prod := NewProducer(newClient(t, seeds), ProducerConfig{})
	const n = 8
	for i := range n {
		if _, err := prod.Publish(ctx, topic, []byte("x"), WithMessageID(fmt.Sprint("m-", i)), WithKey([]byte(fmt.Sprint(i)))); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "several failed attempts", func() bool { return attempts.Load() >= 3*testPartitions },
		func() string { return fmt.Sprint(attempts.Load(), " attempts") })
	if err := m1.stop(ctx); err != nil {
		t.Fatal(err)
	}
	if lag := groupLag(t, seeds, group, topic); lag != n {
		t.Fatalf("group lag %d with the store down, want %d: records were committed", lag, n)
	}
	if recs, err := deadLetters(ctx, seeds, dead); err != nil || len(recs) != 0 {
		t.Fatalf("%d dead letters with the store down (%v), want 0", len(recs), err)
	}
	db2, st2 := openSQLite(t)
	effectsTable(t, db2)
	startMember(t, seeds, group, topic, Config{Processor: sqlProcessor(t, st2, nil), DeadLetter: dead, Concurrency: 4})
	eventually(t, "every record committed", func() bool { return groupLag(t, seeds, group, topic) == 0 },
		func() string { return fmt.Sprint("lag ", groupLag(t, seeds, group, topic)) })
	if rows, distinct := effectRows(t, db2); rows != n || distinct != n {
		t.Fatalf("%d effect rows (%d distinct), want %d", rows, distinct, n)
	}
}

// Cancelling Run's context while a handler runs: the handler sees it, its
// transaction rolls back, the offset is not committed, Run returns the
// context's error, and the next member processes the record once.
func TestContextCancelMidHandler(t *testing.T) {
	t.Parallel()
	topic, dead, group := uniqueName("cancel"), uniqueName("cancel-dead"), uniqueName("cancel-group")
	seeds := newCluster(t, topic, dead).ListenAddrs()
	db, st := openSQLite(t)
	effectsTable(t, db)
	entered := make(chan struct{})
	var once sync.Once
	proc := sqlProcessor(t, st, func(ctx context.Context, msg idem.Message) error {
		once.Do(func() { close(entered) })
		<-ctx.Done()
		return ctx.Err()
	})
	cl, err := kgo.NewClient(groupOpts(seeds, group, topic)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	c, err := NewConsumer(cl, Config{Processor: proc, DeadLetter: dead})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancelRun := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if _, err := NewProducer(newClient(t, seeds), ProducerConfig{}).Publish(ctx, topic, []byte("x"), WithMessageID("m-1")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal("handler not entered")
	}
	cancelRun()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Run after cancel: %v, want context.Canceled", err)
		}
	case <-ctx.Done():
		t.Fatal("Run did not return after cancel")
	}
	cl.Close()
	if lag := groupLag(t, seeds, group, topic); lag != 1 {
		t.Fatalf("group lag %d after a cancelled handler, want 1", lag)
	}
	startMember(t, seeds, group, topic, Config{Processor: sqlProcessor(t, st, nil), DeadLetter: dead})
	eventually(t, "the record committed", func() bool { return groupLag(t, seeds, group, topic) == 0 },
		func() string { return "lag" })
	if rows, _ := effectRows(t, db); rows != 1 {
		t.Fatalf("%d effect rows, want 1", rows)
	}
}

// Stop before Run, Stop twice and concurrently, Run twice, and a new
// Consumer on a client whose first Consumer was stopped before it ran.
func TestLifecycleAbuse(t *testing.T) {
	t.Parallel()
	topic, dead, group := uniqueName("life"), uniqueName("life-dead"), uniqueName("life-group")
	seeds := newCluster(t, topic, dead).ListenAddrs()
	proc := idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
		return idem.Outcome{Status: idem.Processed, MessageID: msg.ID}, nil
	})
	cl, err := kgo.NewClient(groupOpts(seeds, group, topic)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()

	c0, err := NewConsumer(cl, Config{Processor: proc, DeadLetter: dead})
	if err != nil {
		t.Fatal(err)
	}
	if err := c0.Stop(ctx); err != nil {
		t.Fatalf("Stop before Run: %v", err)
	}
	if err := c0.Stop(ctx); err != nil {
		t.Fatalf("second Stop before Run: %v", err)
	}
	// The client is free again: a Consumer that will never run does not
	// keep it.
	c1, err := NewConsumer(cl, Config{Processor: proc, DeadLetter: dead})
	if err != nil {
		t.Fatalf("NewConsumer after the first Consumer was stopped before running: %v", err)
	}
	if err := c0.Run(ctx); err != nil {
		t.Fatalf("Run after Stop: %v, want nil at once", err)
	}
	done := make(chan error, 1)
	go func() { done <- c1.Run(ctx) }()
	// Run twice.
	waitRan := time.Now().Add(waitFor)
	for {
		c1.mu.Lock()
		ran := c1.ran
		c1.mu.Unlock()
		if ran || time.Now().After(waitRan) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := c1.Run(ctx); !errors.Is(err, ErrAlreadyRunning) {
		t.Fatalf("second Run: %v, want ErrAlreadyRunning", err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if err := c1.Stop(ctx); err != nil {
				t.Errorf("concurrent Stop: %v", err)
			}
		})
	}
	wg.Wait()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// A Consumer made but never run (say, its caller failed to start) does not
// keep the client: it can be dropped and another Consumer made.
func TestNewConsumerAfterUnusedConsumer(t *testing.T) {
	t.Parallel()
	topic, dead, group := uniqueName("unused"), uniqueName("unused-dead"), uniqueName("unused-group")
	seeds := newCluster(t, topic, dead).ListenAddrs()
	proc := idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
		return idem.Outcome{Status: idem.Processed, MessageID: msg.ID}, nil
	})
	cl, err := kgo.NewClient(groupOpts(seeds, group, topic)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	c0, err := NewConsumer(cl, Config{Processor: proc, DeadLetter: dead})
	if err != nil {
		t.Fatal(err)
	}
	_ = c0.Stop(context.Background())
	if _, err := NewConsumer(cl, Config{Processor: proc, DeadLetter: dead}); err != nil {
		t.Fatalf("NewConsumer after Stop of an unused Consumer: %v", err)
	}
}

// A member crashes while the dead letter of a record is being produced
// (the dead-letter topic does not exist yet, so the produce waits): the
// record is not committed; once the topic exists, the next member
// dead-letters it and commits.
func TestCrashWhileDeadLetterInFlight(t *testing.T) {
	t.Parallel()
	topic, dead, group := uniqueName("dlcrash"), uniqueName("dlcrash-dead"), uniqueName("dlcrash-group")
	seeds := newCluster(t, topic).ListenAddrs()
	raw := newClient(t, seeds)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if err := raw.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("no id")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	proc := idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
		calls.Add(1)
		return idem.Outcome{Status: idem.Rejected, Err: idem.ErrMissingMessageID}, idem.ErrMissingMessageID
	})
	m1 := startMember(t, seeds, group, topic, Config{Processor: proc, DeadLetter: dead, CommitTimeout: 30 * time.Second})
	eventually(t, "the record taken", func() bool { return calls.Load() >= 1 }, func() string { return "no call" })
	time.Sleep(200 * time.Millisecond) // the produce is waiting for the topic
	m1.crash()
	if lag := groupLag(t, seeds, group, topic); lag != 1 {
		t.Fatalf("group lag %d after the crash, want 1", lag)
	}
	if _, err := kadm.NewClient(raw).CreateTopic(ctx, 1, 1, nil, dead); err != nil {
		t.Fatal(err)
	}
	startMember(t, seeds, group, topic, Config{Processor: proc, DeadLetter: dead})
	eventually(t, "the record dead-lettered and committed", func() bool { return groupLag(t, seeds, group, topic) == 0 },
		func() string { return "lag" })
	recs, err := deadLetters(ctx, seeds, dead)
	if err != nil {
		t.Fatal(err)
	}
	// At least once: the crashed member's produce may have landed too.
	if len(recs) < 1 || len(recs) > 2 || string(recs[0].Value) != "no id" {
		t.Fatalf("%d dead letters, want 1 (or 2, one from the crashed member)", len(recs))
	}
}

// In transactional mode a handler error marked idem.Permanent does not
// block its partition for ever: the record is dead-lettered and the
// partition goes on.
func TestPermanentFailureTransactional(t *testing.T) {
	t.Parallel()
	topic, dead, group := uniqueName("perm"), uniqueName("perm-dead"), uniqueName("perm-group")
	seeds := newCluster(t, topic, dead).ListenAddrs()
	db, st := openSQLite(t)
	effectsTable(t, db)
	proc := sqlProcessor(t, st, func(ctx context.Context, msg idem.Message) error {
		if msg.ID == "poison" {
			return idem.Permanent(errors.New("amount is negative"))
		}
		return nil
	})
	startMember(t, seeds, group, topic, Config{Processor: proc, DeadLetter: dead, RetryDelay: 50 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	prod := NewProducer(newClient(t, seeds), ProducerConfig{})
	for _, id := range []string{"a", "poison", "b"} {
		if _, err := prod.Publish(ctx, topic, []byte(id), WithMessageID(id), WithKey([]byte("one-partition"))); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "every record committed", func() bool { return groupLag(t, seeds, group, topic) == 0 },
		func() string { return "lag" })
	if rows, _ := effectRows(t, db); rows != 2 {
		t.Fatalf("%d effect rows, want 2 (the poison one rolled back)", rows)
	}
	recs, err := deadLetters(ctx, seeds, dead)
	if err != nil || len(recs) != 1 || header(recs[0], DefaultIDHeader) != "poison" {
		t.Fatalf("dead letters %v (%v), want the poison record", len(recs), err)
	}
}

// Many copies of one message ID spread over every partition, in lease mode,
// on two members: one effect, every record committed, nothing
// dead-lettered.
func TestInProgressStorm(t *testing.T) {
	t.Parallel()
	topic, dead, group := uniqueName("storm"), uniqueName("storm-dead"), uniqueName("storm-group")
	seeds := newCluster(t, topic, dead).ListenAddrs()
	var effects atomic.Int64
	lc, err := idem.NewLeaseConsumer(idem.NewMemoryStore(nil), idem.Config{Name: "storm", PurgeInterval: -1, Lease: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lc.Close() })
	proc := idem.BindLease(lc, func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
		time.Sleep(300 * time.Millisecond)
		effects.Add(1)
		return idem.Result{}, nil
	})
	cfg := Config{Processor: proc, DeadLetter: dead, Concurrency: testPartitions, RetryDelay: 50 * time.Millisecond}
	startMember(t, seeds, group, topic, cfg)
	startMember(t, seeds, group, topic, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	prod := NewProducer(newClient(t, seeds), ProducerConfig{})
	const copies = 40
	for i := range copies {
		if _, err := prod.Publish(ctx, topic, []byte("same"), WithMessageID("storm-1"), WithKey([]byte(fmt.Sprint(i)))); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "every copy committed", func() bool { return groupLag(t, seeds, group, topic) == 0 },
		func() string { return fmt.Sprint("lag ", groupLag(t, seeds, group, topic)) })
	if n := effects.Load(); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	if recs, err := deadLetters(ctx, seeds, dead); err != nil || len(recs) != 0 {
		t.Fatalf("%d dead letters (%v), want 0", len(recs), err)
	}
}

// Six members on a group of four partitions (two idle), members leaving
// and joining while records flow: every record has exactly one effect and
// everything is committed in the end.
func TestManyMembers(t *testing.T) {
	t.Parallel()
	topic, dead, group := uniqueName("many"), uniqueName("many-dead"), uniqueName("many-group")
	seeds := newCluster(t, topic, dead).ListenAddrs()
	db, st := openSQLite(t)
	effectsTable(t, db)
	proc := sqlProcessor(t, st, nil)
	cfg := Config{Processor: proc, DeadLetter: dead, Concurrency: 2, RetryDelay: 50 * time.Millisecond}
	var members []*member
	for range 6 {
		members = append(members, startMember(t, seeds, group, topic, cfg))
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	prod := NewProducer(newClient(t, seeds), ProducerConfig{})
	const n = 200
	for i := range n {
		if _, err := prod.Publish(ctx, topic, []byte("x"), WithMessageID(fmt.Sprint("m-", i)), WithKey([]byte(fmt.Sprint(i)))); err != nil {
			t.Fatal(err)
		}
		switch i {
		case 50:
			if err := members[0].stop(ctx); err != nil {
				t.Fatal(err)
			}
		case 100:
			members[1].crash()
		case 150:
			startMember(t, seeds, group, topic, cfg)
		}
	}
	eventually(t, "every record committed", func() bool { return groupLag(t, seeds, group, topic) == 0 },
		func() string { return fmt.Sprint("lag ", groupLag(t, seeds, group, topic)) })
	if rows, distinct := effectRows(t, db); rows != n || distinct != n {
		t.Fatalf("%d effect rows (%d distinct), want %d", rows, distinct, n)
	}
}

// After Stop and Close, none of the Consumer's goroutines is left.
func TestNoGoroutineLeft(t *testing.T) {
	topic, dead, group := uniqueName("leak"), uniqueName("leak-dead"), uniqueName("leak-group")
	seeds := newCluster(t, topic, dead).ListenAddrs()
	prod := NewProducer(newClient(t, seeds), ProducerConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	for i := range 20 {
		if _, err := prod.Publish(ctx, topic, []byte("x"), WithMessageID(fmt.Sprint("m-", i)), WithKey([]byte(fmt.Sprint(i)))); err != nil {
			t.Fatal(err)
		}
	}
	var processed atomic.Int64
	proc := idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
		if processed.Add(1)%3 == 0 {
			err := errors.New("flaky")
			return idem.Outcome{Status: idem.Failed, MessageID: msg.ID, Err: err}, err
		}
		return idem.Outcome{Status: idem.Processed, MessageID: msg.ID}, nil
	})
	before := consumerGoroutines()
	m := startMember(t, seeds, group, topic, Config{Processor: proc, DeadLetter: dead, Concurrency: 4, RetryDelay: 50 * time.Millisecond})
	eventually(t, "records processed", func() bool { return processed.Load() >= 20 }, func() string { return "" })
	if err := m.stop(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for consumerGoroutines() > before && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := consumerGoroutines(); n > before {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d idemkafka goroutines left after Stop, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
}

// consumerGoroutines counts the goroutines running this package's code
// (other parallel tests' Consumers included, so the test is not parallel).
func consumerGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "idemkafka.(*Consumer)") {
			count++
		}
	}
	return count
}

// A dead-letter topic that is also a consumed topic would feed every dead
// letter back to the Consumer, which would dead-letter it again, for ever
// (the AMQP and Redis adapters refuse the same mistake): NewConsumer
// refuses it.
func TestDeadLetterIsConsumedTopic(t *testing.T) {
	t.Parallel()
	topic, other := uniqueName("self"), uniqueName("self-other")
	seeds := newCluster(t, topic, other).ListenAddrs()
	proc := idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
		return idem.Outcome{Status: idem.Processed, MessageID: msg.ID}, nil
	})
	cl := newClient(t, seeds, append([]kgo.Opt{kgo.ConsumerGroup(uniqueName("g")), kgo.ConsumeTopics(other, topic)}, ClientOpts()...)...)
	if _, err := NewConsumer(cl, Config{Processor: proc, DeadLetter: topic}); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("NewConsumer with DeadLetter %q among the consumed topics: %v, want ErrInvalidConfig", topic, err)
	}
	// A client consuming by regular expression: its patterns are checked.
	rx := newClient(t, seeds, append([]kgo.Opt{kgo.ConsumerGroup(uniqueName("g")), kgo.ConsumeTopics("^self-.*"), kgo.ConsumeRegex()}, ClientOpts()...)...)
	if _, err := NewConsumer(rx, Config{Processor: proc, DeadLetter: "dead"}); err != nil {
		t.Fatalf("NewConsumer with a regex client: %v", err)
	}
	if _, err := NewConsumer(rx, Config{Processor: proc, DeadLetter: "self-dead"}); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("NewConsumer with DeadLetter matched by the consumed pattern: %v, want ErrInvalidConfig", err)
	}
}

// A producer that forwards the headers of the record it consumed (a common
// relay pattern) with WithHeaders, and publishes under a new message ID,
// must not send two ID headers with different values: the consumer would
// find the ID ambiguous and dead-letter every such record. The forwarded
// ID header is left out; the other headers go through.
func TestPublishForwardedIDHeader(t *testing.T) {
	t.Parallel()
	topic := uniqueName("fwd")
	seeds := newCluster(t, topic).ListenAddrs()
	cl := newClient(t, seeds, kgo.ConsumeTopics(topic), kgo.FetchMaxWait(250*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	incoming := []kgo.RecordHeader{{Key: DefaultIDHeader, Value: []byte("upstream-7")}, {Key: "trace", Value: []byte("t1")}}
	if _, err := NewProducer(cl, ProducerConfig{}).Publish(ctx, topic, []byte("x"), WithMessageID("downstream-7"), WithHeaders(incoming...)); err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for len(recs) < 1 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatal(ctx.Err())
		}
		recs = append(recs, fs.Records()...)
	}
	id, err := headerID(recs[0], DefaultIDHeader)
	if err != nil || id != "downstream-7" {
		t.Fatalf("the consumer reads ID %q, %v; want downstream-7 (headers %v)", id, err, recs[0].Headers)
	}
	if header(recs[0], "trace") != "t1" {
		t.Fatalf("forwarded header lost: %v", recs[0].Headers)
	}
}

// In batch mode one handler error fails every new record of the batch. When
// that error is permanent (idem.Permanent) only the record that caused it
// may be dead-lettered: the others of the batch are processed, not sent to
// the dead letter with it.
func TestBatchPermanentFailureIsolated(t *testing.T) {
	t.Parallel()
	topic, dead, group := uniqueName("bperm"), uniqueName("bperm-dead"), uniqueName("bperm-group")
	seeds := newCluster(t, topic, dead).ListenAddrs()
	db, st := openSQLite(t)
	effectsTable(t, db)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	prod := NewProducer(newClient(t, seeds), ProducerConfig{})
	ids := []string{"a", "b", "poison", "c", "d"}
	for _, id := range ids { // one partition, published before the member starts: one batch
		if _, err := prod.Publish(ctx, topic, []byte(id), WithMessageID(id), WithKey([]byte("one-partition"))); err != nil {
			t.Fatal(err)
		}
	}
	ic, err := idem.NewConsumer(st, idem.Config{Name: "kafka-adv-batch", PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ic.Close() })
	var biggest atomic.Int64
	bp := idem.BindBatch(ic, func(ctx context.Context, tx *sql.Tx, msgs []idem.Message) error {
		if int64(len(msgs)) > biggest.Load() {
			biggest.Store(int64(len(msgs)))
		}
		for _, m := range msgs {
			if m.ID == "poison" {
				return idem.Permanent(errors.New("amount is negative"))
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO effects (id) VALUES (?)`, m.ID); err != nil {
				return err
			}
		}
		return nil
	})
	startMember(t, seeds, group, topic, Config{BatchProcessor: bp, BatchSize: 10, DeadLetter: dead, RetryDelay: 50 * time.Millisecond})
	eventually(t, "every record committed", func() bool { return groupLag(t, seeds, group, topic) == 0 },
		func() string { return fmt.Sprint("lag ", groupLag(t, seeds, group, topic)) })
	if biggest.Load() < 2 {
		t.Skipf("the records did not arrive in one batch (largest %d); nothing to isolate", biggest.Load())
	}
	recs, err := deadLetters(ctx, seeds, dead)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range recs {
		got = append(got, header(r, DefaultIDHeader))
	}
	if len(got) != 1 || got[0] != "poison" {
		t.Fatalf("dead letters %v, want only [poison]", got)
	}
	if rows, distinct := effectRows(t, db); rows != 4 || distinct != 4 {
		t.Fatalf("%d effect rows (%d distinct), want 4 (every record but the poison one)", rows, distinct)
	}
}

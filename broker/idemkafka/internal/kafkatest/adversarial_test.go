package kafkatest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"github.com/idem-go/idem/internal/testenv"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemkafka"
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

// The ID header repeated: with different values the ID is ambiguous and
// the record is dead-lettered (reason "invalid-message-id") without calling
// the Processor; the same value twice is one ID, processed once. (IDs that
// break idem's rules are in the conformance suite.)
func TestRepeatedIDHeader(t *testing.T) {
	t.Parallel()
	topic, dead, group := uniqueName("badid"), uniqueName("badid-dead"), uniqueName("badid-group")
	seeds := newCluster(t, topic, dead).ListenAddrs()
	raw := newClient(t, seeds)
	db, st := openSQLite(t)
	effectsTable(t, db)
	startMember(t, seeds, group, topic, idemkafka.Config{Processor: sqlProcessor(t, st, nil), DeadLetter: dead, Concurrency: 4, RetryDelay: 50 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	produce := func(value string, ids ...string) {
		t.Helper()
		var hs []kgo.RecordHeader
		for _, id := range ids {
			hs = append(hs, kgo.RecordHeader{Key: idemkafka.DefaultIDHeader, Value: []byte(id)})
		}
		if err := raw.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte(value), Headers: hs}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	produce("two-values", "first", "second")
	produce("same-twice", "twice", "twice")
	testenv.Eventually(t, waitFor, "every record settled and committed", func() bool {
		return groupLag(t, seeds, group, topic) == 0
	}, func() string { return fmt.Sprintf("lag %d", groupLag(t, seeds, group, topic)) })
	if rows, distinct := effectRows(t, db); rows != 1 || distinct != 1 {
		t.Errorf("%d effect rows (%d distinct), want 1", rows, distinct)
	}
	recs, err := deadLetters(ctx, seeds, dead)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || string(recs[0].Value) != "two-values" || header(recs[0], idem.HeaderDeadLetterReason) != idem.ReasonInvalidMessageID ||
		header(recs[0], idem.HeaderDeadLetterStatus) != "Rejected" || !strings.Contains(header(recs[0], idem.HeaderDeadLetterError), idem.ErrInvalidMessageID.Error()) {
		t.Fatalf("dead letters %v, want the two-values record, invalid-message-id", recs)
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
	c0, err := idemkafka.NewConsumer(cl, idemkafka.Config{Processor: proc, DeadLetter: dead})
	if err != nil {
		t.Fatal(err)
	}
	_ = c0.Stop(context.Background())
	if _, err := idemkafka.NewConsumer(cl, idemkafka.Config{Processor: proc, DeadLetter: dead}); err != nil {
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
	m1 := startMember(t, seeds, group, topic, idemkafka.Config{Processor: proc, DeadLetter: dead, CommitTimeout: 30 * time.Second})
	testenv.Eventually(t, waitFor, "the record taken", func() bool { return calls.Load() >= 1 }, func() string { return "no call" })
	time.Sleep(200 * time.Millisecond) // the produce is waiting for the topic
	m1.crash()
	if lag := groupLag(t, seeds, group, topic); lag != 1 {
		t.Fatalf("group lag %d after the crash, want 1", lag)
	}
	if _, err := kadm.NewClient(raw).CreateTopic(ctx, 1, 1, nil, dead); err != nil {
		t.Fatal(err)
	}
	startMember(t, seeds, group, topic, idemkafka.Config{Processor: proc, DeadLetter: dead})
	testenv.Eventually(t, waitFor, "the record dead-lettered and committed", func() bool { return groupLag(t, seeds, group, topic) == 0 },
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
	cfg := idemkafka.Config{Processor: proc, DeadLetter: dead, Concurrency: testPartitions, RetryDelay: 50 * time.Millisecond}
	startMember(t, seeds, group, topic, cfg)
	startMember(t, seeds, group, topic, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	prod := idemkafka.NewProducer(newClient(t, seeds), idemkafka.ProducerConfig{})
	const copies = 40
	for i := range copies {
		if _, err := prod.Publish(ctx, topic, []byte("same"), idemkafka.WithMessageID("storm-1"), idemkafka.WithKey([]byte(fmt.Sprint(i)))); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, waitFor, "every copy committed", func() bool { return groupLag(t, seeds, group, topic) == 0 },
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
	cfg := idemkafka.Config{Processor: proc, DeadLetter: dead, Concurrency: 2, RetryDelay: 50 * time.Millisecond}
	var members []*member
	for range 6 {
		members = append(members, startMember(t, seeds, group, topic, cfg))
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	prod := idemkafka.NewProducer(newClient(t, seeds), idemkafka.ProducerConfig{})
	const n = 200
	for i := range n {
		if _, err := prod.Publish(ctx, topic, []byte("x"), idemkafka.WithMessageID(fmt.Sprint("m-", i)), idemkafka.WithKey([]byte(fmt.Sprint(i)))); err != nil {
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
	testenv.Eventually(t, waitFor, "every record committed", func() bool { return groupLag(t, seeds, group, topic) == 0 },
		func() string { return fmt.Sprint("lag ", groupLag(t, seeds, group, topic)) })
	if rows, distinct := effectRows(t, db); rows != n || distinct != n {
		t.Fatalf("%d effect rows (%d distinct), want %d", rows, distinct, n)
	}
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
	cl := newClient(t, seeds, append([]kgo.Opt{kgo.ConsumerGroup(uniqueName("g")), kgo.ConsumeTopics(other, topic)}, idemkafka.ClientOpts()...)...)
	if _, err := idemkafka.NewConsumer(cl, idemkafka.Config{Processor: proc, DeadLetter: topic}); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("NewConsumer with DeadLetter %q among the consumed topics: %v, want ErrInvalidConfig", topic, err)
	}
	// A client consuming by regular expression: its patterns are checked.
	rx := newClient(t, seeds, append([]kgo.Opt{kgo.ConsumerGroup(uniqueName("g")), kgo.ConsumeTopics("^self-.*"), kgo.ConsumeRegex()}, idemkafka.ClientOpts()...)...)
	if _, err := idemkafka.NewConsumer(rx, idemkafka.Config{Processor: proc, DeadLetter: "dead"}); err != nil {
		t.Fatalf("NewConsumer with a regex client: %v", err)
	}
	if _, err := idemkafka.NewConsumer(rx, idemkafka.Config{Processor: proc, DeadLetter: "self-dead"}); !errors.Is(err, idem.ErrInvalidConfig) {
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
	incoming := []kgo.RecordHeader{{Key: idemkafka.DefaultIDHeader, Value: []byte("upstream-7")}, {Key: "trace", Value: []byte("t1")}}
	if _, err := idemkafka.NewProducer(cl, idemkafka.ProducerConfig{}).Publish(ctx, topic, []byte("x"), idemkafka.WithMessageID("downstream-7"), idemkafka.WithHeaders(incoming...)); err != nil {
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
	// What the consumer reads: every ID header must carry the one ID (two
	// different values would make it ambiguous).
	var ids []string
	for _, h := range recs[0].Headers {
		if h.Key == idemkafka.DefaultIDHeader {
			ids = append(ids, string(h.Value))
		}
	}
	if len(ids) == 0 || slices.ContainsFunc(ids, func(id string) bool { return id != "downstream-7" }) {
		t.Fatalf("the consumer reads ID headers %q; want downstream-7 only (headers %v)", ids, recs[0].Headers)
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
	prod := idemkafka.NewProducer(newClient(t, seeds), idemkafka.ProducerConfig{})
	ids := []string{"a", "b", "poison", "c", "d"}
	for _, id := range ids { // one partition, published before the member starts: one batch
		if _, err := prod.Publish(ctx, topic, []byte(id), idemkafka.WithMessageID(id), idemkafka.WithKey([]byte("one-partition"))); err != nil {
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
	startMember(t, seeds, group, topic, idemkafka.Config{BatchProcessor: bp, BatchSize: 10, DeadLetter: dead, RetryDelay: 50 * time.Millisecond})
	testenv.Eventually(t, waitFor, "every record committed", func() bool { return groupLag(t, seeds, group, topic) == 0 },
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
		got = append(got, header(r, idemkafka.DefaultIDHeader))
	}
	if len(got) != 1 || got[0] != "poison" {
		t.Fatalf("dead letters %v, want only [poison]", got)
	}
	if rows, distinct := effectRows(t, db); rows != 4 || distinct != 4 {
		t.Fatalf("%d effect rows (%d distinct), want 4 (every record but the poison one)", rows, distinct)
	}
}

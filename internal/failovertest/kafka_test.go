package failovertest

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	_ "modernc.org/sqlite"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemkafka"
	"github.com/idem-go/idem/store/idemsql"
)

// kafkaPartitions is the number of partitions of the failover topic.
const kafkaPartitions = 3

// TestKafkaPartitionLeaderMove publishes messages with stable IDs
// (idemkafka.WithMessageID, keyed by ID so they spread over the
// partitions) to a topic on kfake, franz-go's in-process Kafka, with three
// brokers, while idemkafka consumes them in a consumer group into a
// transactional idem consumer on SQLite whose effect is a row inserted in
// the record's transaction. Mid-load every partition's leader is moved to
// another broker (kfake.Cluster.MoveTopicPartition, which bumps the
// partition's leader epoch) and the group coordinator with it
// (RehashCoordinators): the producer and the consumer get
// NOT_LEADER_OR_FOLLOWER and NOT_COORDINATOR and must find the new ones.
// The first produce each new leader takes is written, then answered
// REQUEST_TIMED_OUT (a kfake.Fault), as a real broker can answer a
// produce it appended while the leadership moved: franz-go sends it again.
//
// The configurations: an idempotent producer (franz-go's default), whose
// resend the broker recognises by its sequence number; a producer with
// kgo.DisableIdempotentWrite, whose resend is a second copy in the log
// under the same message ID, which idem's record turns into a Duplicate;
// and a consumer whose kgo.ConsumeResetOffset is the end of the partition
// rather than franz-go's default (a minute before the last record
// consumed). On every move kfake answers the consumer's
// OffsetForLeaderEpoch with no end offset for the epoch it read at, so
// franz-go reports a kgo.ErrDataLoss and resumes at ConsumeResetOffset:
// the default re-reads (records idemkafka already queued are dropped),
// the end skips what the consumer had not fetched yet.
//
// Lost is a message whose publish was acknowledged and whose effect never
// ran; doubles an effect row beyond the first; the time to recover runs
// from the move to the first effect of a message published after it. Both
// counts are asserted zero but with the reset at the end: the offsets
// idemkafka commits never pass a record whose transaction did not commit,
// and the record rules out a second effect however often the log holds or
// delivers a message.
//
// What kfake cannot do: it keeps one log per partition that every broker
// serves (the high watermark moves on append; there is no replication,
// in-sync replica set or follower log), so a leader move here never
// loses an acknowledged record nor truncates one, whatever acks the
// producer asks for; docs/failover.md says what that leaves unmeasured.
func TestKafkaPartitionLeaderMove(t *testing.T) {
	t.Parallel()
	for _, cfg := range []kafkaConfig{
		{name: "idempotent_producer"},
		{name: "producer_not_idempotent", notIdempotent: true},
		{name: "reset_offset_at_end", resetAtEnd: true},
	} {
		t.Run(cfg.name, func(t *testing.T) { testKafkaPartitionLeaderMove(t, cfg) })
	}
}

// kafkaConfig is one configuration of TestKafkaPartitionLeaderMove.
type kafkaConfig struct {
	name string
	// notIdempotent: the producer has kgo.DisableIdempotentWrite, so the
	// produce it sends again after REQUEST_TIMED_OUT is written again.
	notIdempotent bool
	// resetAtEnd: the consumer's kgo.ConsumeResetOffset is the end of the
	// partition (Kafka's auto.offset.reset=latest); otherwise it is
	// franz-go's default, RewindOffset(time.Minute). The counts are
	// recorded, not asserted zero.
	resetAtEnd bool
}

func testKafkaPartitionLeaderMove(t *testing.T, cfg kafkaConfig) {
	ctx := t.Context()
	const topic, group = "failover", "failover"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(kafkaPartitions, topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	seeds := cluster.ListenAddrs()

	db, err := sql.Open("sqlite", idemsql.SQLiteDSN(filepath.Join(t.TempDir(), "idem.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	store, err := idemsql.New(db, idemsql.SQLite, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE failover_effects (id TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	consumer, err := idem.NewConsumer(store, idem.Config{Name: "failover", PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()

	// tracking of the round in progress: when the move happened, which
	// messages were published after it, and the first effect of one.
	var (
		mu         sync.Mutex
		movedAt    time.Time
		afterMove  = map[string]bool{}
		recovered  time.Duration
		duplicates int // deliveries idem answered Duplicate
	)
	bound := idem.Bind(consumer, func(ctx context.Context, tx *sql.Tx, m idem.Message) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO failover_effects (id) VALUES (?)`, m.ID)
		return err
	})
	proc := idem.ProcessorFunc(func(ctx context.Context, m idem.Message) (idem.Outcome, error) {
		out, err := bound.Process(ctx, m)
		mu.Lock()
		switch {
		case err == nil && out.Status == idem.Duplicate:
			duplicates++
		case err == nil && out.Status == idem.Processed && afterMove[m.ID] && recovered == 0:
			recovered = time.Since(movedAt)
		}
		mu.Unlock()
		return out, err
	})

	var reset []kgo.Opt // franz-go's default
	if cfg.resetAtEnd {
		// The group starts at offset 0 all the same: committed before it
		// joins, so that only a reset in a failover moves to the end.
		admin := kadm.NewClient(newKafkaClient(t, kgo.SeedBrokers(seeds...)))
		var start kadm.Offsets
		for p := range int32(kafkaPartitions) {
			start.AddOffset(topic, p, 0, -1)
		}
		resps, err := admin.CommitOffsets(ctx, group, start)
		if err == nil {
			err = resps.Error()
		}
		if err != nil {
			t.Fatal(err)
		}
		reset = []kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd())}
	}
	gcl := newKafkaClient(t, append([]kgo.Opt{
		kgo.SeedBrokers(seeds...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.FetchMaxWait(250 * time.Millisecond), kgo.HeartbeatInterval(250 * time.Millisecond),
	}, append(reset, idemkafka.ClientOpts()...)...)...)
	resets := &dataLossLog{}
	sub, err := idemkafka.NewConsumer(gcl, idemkafka.Config{Processor: proc, Concurrency: workers,
		RetryDelay: 100 * time.Millisecond, DeadLetter: "failover-dead", Logger: slog.New(resets)})
	if err != nil {
		t.Fatal(err)
	}
	defer background(ctx, sub.Run)()

	popts := []kgo.Opt{kgo.SeedBrokers(seeds...), kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond })}
	if cfg.notIdempotent {
		popts = append(popts, kgo.DisableIdempotentWrite())
	}
	producer := idemkafka.NewProducer(newKafkaClient(t, popts...), idemkafka.ProducerConfig{})

	var m matrix
	var timedOut int // produces answered REQUEST_TIMED_OUT after the write
	n := messages(t)
	for r := range reducedRounds(t) {
		all := ids(r, n)
		published := map[string]bool{}
		resets.n.Store(0)
		mu.Lock()
		movedAt, recovered, duplicates = time.Time{}, 0, 0
		clear(afterMove)
		mu.Unlock()
		var fault *kfake.FaultHandle // the produces answered REQUEST_TIMED_OUT
		for i, id := range all {
			if i == n/3 {
				var faults []kfake.Fault
				for p := range int32(kafkaPartitions) {
					to := (cluster.LeaderFor(topic, p) + 1) % 3
					// The first produce of p that reaches its new leader is
					// written, then answered REQUEST_TIMED_OUT.
					faults = append(faults, kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Nodes: []int32{to}, Topic: topic,
						Partitions: []int32{p}, Err: kerr.RequestTimedOut, Count: 1})
					if err := cluster.MoveTopicPartition(topic, p, to); err != nil {
						t.Fatal(err)
					}
				}
				fault = cluster.Fault(faults...)
				cluster.RehashCoordinators()
				mu.Lock()
				movedAt = time.Now()
				mu.Unlock()
			}
			if i >= n/3 {
				mu.Lock()
				afterMove[id] = true
				mu.Unlock()
			}
			// A publish that was not acknowledged is sent again, with the
			// same ID, as a producer does.
			for {
				pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := producer.Publish(pctx, topic, []byte(id), idemkafka.WithMessageID(id), idemkafka.WithKey([]byte(id)))
				cancel()
				if err == nil {
					break
				}
				if ctx.Err() != nil {
					t.Fatal(ctx.Err())
				}
				if mt := movedAt; !mt.IsZero() && time.Since(mt) > 2*time.Minute {
					t.Fatalf("publish of %s: %v, two minutes after the move", id, err)
				}
			}
			published[id] = true
		}
		timedOut += fault.Hits()
		fault.Remove()
		// Every acknowledged publish should reach the effect; wait until
		// it does, or until nothing more arrives for 5 seconds
		// (in-process: nothing is restarting).
		effects := awaitEffects(all, func() map[string]int { return kafkaEffects(t, db) }, 5*time.Second)
		mu.Lock()
		rec, dups := recovered, duplicates
		mu.Unlock()
		if rec == 0 {
			t.Fatalf("round %d: no message published after the move had its effect", r)
		}
		doubles, lost := m.add(roundResult{acked: published, recover: rec}, all, effects)
		t.Logf("round %d: %d doubles, %d lost (published, no effect), %d deliveries idem answered Duplicate, %d offset resets (kgo.ErrDataLoss), recovered in %v",
			r, doubles, lost, dups, resets.n.Load(), rec)
		if (doubles != 0 || lost != 0) && !cfg.resetAtEnd {
			t.Errorf("round %d: %d doubles, %d lost; want none", r, doubles, lost)
		}
	}
	// idemkafka warns at start-up of a reset to the end, and only then.
	if risks := resets.risks.logged(); cfg.resetAtEnd != (len(risks) == 1) || len(risks) > 1 {
		t.Errorf("start-up warnings %q; want one about kgo.ConsumeResetOffset only with the reset at the end", risks)
	}
	copies := kafkaLogCopies(t, seeds, topic, reducedRounds(t)*n)
	switch {
	case timedOut == 0:
		t.Error("no produce was answered REQUEST_TIMED_OUT: the fault never fired")
	case cfg.notIdempotent && copies == 0:
		t.Errorf("%d produces timed out after the write and were sent again, yet the log holds no copy", timedOut)
	case !cfg.notIdempotent && copies != 0:
		t.Errorf("the idempotent producer left %d copies in the log", copies)
	}
	t.Logf("Kafka (kfake, 3 brokers), partition leaders and coordinator moved, %s: %d produces answered REQUEST_TIMED_OUT after the write, %d records in the log beyond one per ID; %v",
		cfg.name, timedOut, copies, &m)
}

// kafkaEffects returns the effect rows per message ID.
func kafkaEffects(t *testing.T, db *sql.DB) map[string]int {
	t.Helper()
	rows, err := db.Query(`SELECT id, COUNT(*) FROM failover_effects GROUP BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		out[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// newKafkaClient returns a kgo client with opts, closed when t ends.
func newKafkaClient(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// dataLossLog is a slog.Handler that counts idemkafka's fetch errors that
// are a kgo.ErrDataLoss: the client could not find where the log it had
// consumed continues and reset the partition to kgo.ConsumeResetOffset.
// It passes every record to risks too, which keeps the start-up warnings.
type dataLossLog struct {
	n     atomic.Int64
	risks riskLog
}

func (l *dataLossLog) Enabled(_ context.Context, lvl slog.Level) bool { return lvl >= slog.LevelWarn }

func (l *dataLossLog) Handle(ctx context.Context, r slog.Record) error {
	if err := l.risks.Handle(ctx, r); err != nil {
		return err
	}
	r.Attrs(func(a slog.Attr) bool {
		if e, ok := a.Value.Any().(error); ok && a.Key == "err" {
			var loss *kgo.ErrDataLoss
			if errors.As(e, &loss) {
				l.n.Add(1)
			}
		}
		return true
	})
	return nil
}

func (l *dataLossLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *dataLossLog) WithGroup(string) slog.Handler      { return l }

// kafkaLogCopies reads topic from the start up to want distinct message
// IDs (the idemkafka.DefaultIDHeader) and returns the records beyond one
// per ID: the copies a retried produce left in the log.
func kafkaLogCopies(t *testing.T, seeds []string, topic string, want int) int {
	t.Helper()
	cl := newKafkaClient(t, kgo.SeedBrokers(seeds...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(250*time.Millisecond))
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	seen := map[string]int{}
	records := 0
	for len(seen) < want {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d distinct message IDs of %d from the log: %v", len(seen), want, ctx.Err())
		}
		fs.EachRecord(func(r *kgo.Record) {
			for _, h := range r.Headers {
				if h.Key == idemkafka.DefaultIDHeader {
					seen[string(h.Value)]++
					records++
				}
			}
		})
	}
	return records - len(seen)
}

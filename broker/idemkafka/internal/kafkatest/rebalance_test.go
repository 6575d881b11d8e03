package kafkatest

import (
	"context"
	"database/sql"
	"fmt"
	"github.com/idem-go/idem/internal/testenv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemkafka"
	"github.com/idem-go/idem/broker/idemkafka/internal/testhook"
	"github.com/idem-go/idem/idemdriver"
)

// effectsFixture is a topic on a kfake cluster and a SQLite database with an
// effects table written, one row per message, by a batch handler in the
// claim's transaction. It records every outcome per member.
type effectsFixture struct {
	t        *testing.T
	seeds    []string
	topic    string
	dead     string
	group    string
	db       *sql.DB
	consumer *idem.Consumer[*sql.Tx]

	mu       sync.Mutex
	outcomes map[string][]memberOutcome // message ID -> outcomes in order
}

type memberOutcome struct {
	member string
	status idem.Status
}

func newEffectsFixture(t *testing.T) *effectsFixture {
	t.Helper()
	f := &effectsFixture{t: t, topic: uniqueName("orders"), dead: uniqueName("orders-dead"), group: uniqueName("billing"),
		outcomes: map[string][]memberOutcome{}}
	f.seeds = newCluster(t, f.topic, f.dead).ListenAddrs()
	var store idemdriver.TxStore[*sql.Tx]
	f.db, store = openSQLite(t)
	if _, err := f.db.Exec(`CREATE TABLE effects (message_id TEXT NOT NULL, payload BLOB NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	var err error
	f.consumer, err = idem.NewConsumer(store, idem.Config{Name: "effects", PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.consumer.Close() })
	return f
}

// publish publishes n messages with IDs prefix-0..n-1, keyed by ID (so
// spread over the partitions), and returns the IDs.
func (f *effectsFixture) publish(prefix string, n int) []string {
	f.t.Helper()
	p := idemkafka.NewProducer(newClient(f.t, f.seeds), idemkafka.ProducerConfig{})
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%03d", prefix, i)
		if _, err := p.Publish(context.Background(), f.topic, []byte("payload of "+ids[i]), idemkafka.WithMessageID(ids[i]), idemkafka.WithKey([]byte(ids[i]))); err != nil {
			f.t.Fatal(err)
		}
	}
	return ids
}

// batchProcessor returns the BatchProcessor of member name: idem.BindBatch
// with a handler that inserts one effect row per new message, wrapped by
// around (if not nil) and recording every outcome.
func (f *effectsFixture) batchProcessor(name string, inHandler func(msgs []idem.Message), around func(msgs []idem.Message, outs []idem.Outcome)) idem.BatchProcessor {
	bound := idem.BindBatch(f.consumer, func(ctx context.Context, tx *sql.Tx, msgs []idem.Message) error {
		for _, m := range msgs {
			if _, err := tx.ExecContext(ctx, `INSERT INTO effects (message_id, payload) VALUES (?, ?)`, m.ID, m.Payload); err != nil {
				return err
			}
		}
		if inHandler != nil {
			inHandler(msgs)
		}
		return nil
	})
	return batchFunc(func(ctx context.Context, msgs []idem.Message) ([]idem.Outcome, error) {
		outs, err := bound.ProcessBatch(ctx, msgs)
		f.mu.Lock()
		for i, o := range outs {
			f.outcomes[msgs[i].ID] = append(f.outcomes[msgs[i].ID], memberOutcome{name, o.Status})
		}
		f.mu.Unlock()
		if around != nil {
			around(msgs, outs)
		}
		return outs, err
	})
}

type batchFunc func(ctx context.Context, msgs []idem.Message) ([]idem.Outcome, error)

func (b batchFunc) ProcessBatch(ctx context.Context, msgs []idem.Message) ([]idem.Outcome, error) {
	return b(ctx, msgs)
}

// count returns the outcomes matching keep.
func (f *effectsFixture) count(keep func(id string, o memberOutcome) bool) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for id, os := range f.outcomes {
		for _, o := range os {
			if keep(id, o) {
				n++
			}
		}
	}
	return n
}

// waitRows waits until the effects table holds one row per ID.
func (f *effectsFixture) waitRows(ids []string) {
	f.t.Helper()
	testenv.Eventually(f.t, waitFor, fmt.Sprintf("%d effect rows", len(ids)),
		func() bool { return countRows(f.t, f.db, `SELECT COUNT(DISTINCT message_id) FROM effects`) == len(ids) },
		func() string {
			return fmt.Sprintf("%d distinct of %d", countRows(f.t, f.db, `SELECT COUNT(DISTINCT message_id) FROM effects`), len(ids))
		})
}

// checkExactlyOnce asserts the effects table holds exactly one row per ID
// and nothing else, and the dead letter is empty.
func (f *effectsFixture) checkExactlyOnce(ids []string) {
	f.t.Helper()
	if n := countRows(f.t, f.db, `SELECT COUNT(*) FROM effects`); n != len(ids) {
		f.t.Errorf("effects table has %d rows, want exactly %d (one per message)", n, len(ids))
	}
	for _, id := range ids {
		if n := countRows(f.t, f.db, `SELECT COUNT(*) FROM effects WHERE message_id = ?`, id); n != 1 {
			f.t.Errorf("message %s has %d effect rows, want 1", id, n)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	dls, err := deadLetters(ctx, f.seeds, f.dead)
	if err != nil || len(dls) != 0 {
		f.t.Errorf("dead letter: %d records (%v), want none", len(dls), err)
	}
}

// TestRebalanceJoinWhileBatchInFlight: member A is in the middle of a batch
// (its transaction open, rows written, not committed) when member B joins
// the group. The revocation on A waits for the batch, and commits its
// offsets with everything else A finished, before the partitions move: B
// starts exactly after A's work, so not one message is delivered twice, and
// the effects table has exactly N rows. Run with the eager protocol (every
// partition revoked) and the default cooperative-sticky one.
func TestRebalanceJoinWhileBatchInFlight(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name      string
		balancers []kgo.Opt
	}{
		{"eager", []kgo.Opt{kgo.Balancers(kgo.RangeBalancer())}},
		{"cooperative", nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			const n = 120
			f := newEffectsFixture(t)
			ids := f.publish("join", n)

			held := make(chan []idem.Message, 1)
			release := make(chan struct{})
			var holdOnce sync.Once
			// A's first batch stops inside its transaction until A's
			// revocation has begun.
			inHandler := func(msgs []idem.Message) {
				holdOnce.Do(func() {
					held <- msgs
					<-release
				})
			}
			revoking := make(chan struct{})
			var revokeOnce sync.Once
			cfgA := idemkafka.Config{
				BatchProcessor: f.batchProcessor("A", inHandler, nil),
				BatchSize:      10,
				Concurrency:    2,
				DeadLetter:     f.dead,
				RetryDelay:     100 * time.Millisecond,
				RevokeTimeout:  waitFor, // the assertion is that revocation waits
			}
			testhook.SetOnRevoke(&cfgA, func(m map[string][]int32) {
				if len(m) > 0 {
					revokeOnce.Do(func() { close(revoking) })
				}
			})
			a := startMember(t, f.seeds, f.group, f.topic, cfgA, tt.balancers...)

			var batch []idem.Message
			select {
			case batch = <-held:
			case <-time.After(waitFor):
				t.Fatal("member A never started a batch")
			}

			// B joins while A's batch is in flight.
			bJoined := make(chan *member, 1)
			go func() {
				bJoined <- startMember(t, f.seeds, f.group, f.topic, idemkafka.Config{
					BatchProcessor: f.batchProcessor("B", nil, nil), BatchSize: 10, Concurrency: 2,
					DeadLetter: f.dead, RetryDelay: 100 * time.Millisecond,
				}, tt.balancers...)
			}()
			if tt.name == "eager" {
				// Every partition of A is revoked: the revocation must
				// have begun, and be waiting, while the batch is held.
				select {
				case <-revoking:
				case <-time.After(waitFor):
					t.Fatal("A's partitions were never revoked after B joined")
				}
			}
			close(release)
			b := <-bJoined

			f.waitRows(ids)
			ctx, cancel := context.WithTimeout(context.Background(), waitFor)
			defer cancel()
			if err := a.stop(ctx); err != nil {
				t.Fatalf("stop A: %v", err)
			}
			if err := b.stop(ctx); err != nil {
				t.Fatalf("stop B: %v", err)
			}

			f.checkExactlyOnce(ids)
			for _, m := range batch {
				if got := f.count(func(id string, o memberOutcome) bool { return id == m.ID }); got != 1 {
					t.Errorf("message %s of the in-flight batch was delivered %d times, want once: its offset was not committed on revocation", m.ID, got)
				}
			}
			if dups := f.count(func(_ string, o memberOutcome) bool { return o.status == idem.Duplicate }); dups != 0 {
				t.Errorf("%d Duplicate deliveries, want 0: a revocation must commit what the member finished", dups)
			}
			if byB := f.count(func(_ string, o memberOutcome) bool { return o.member == "B" }); byB == 0 && tt.name == "eager" {
				t.Log("B processed nothing (A had finished before the partitions moved)")
			}
		})
	}
}

// TestRebalanceLeaveWithoutCommitWhileBatchInFlight: two members share the
// work; one of them commits a batch's transaction and leaves the group
// before committing its offsets (it is killed). The group rebalances, the
// survivor is given the partitions and replays the batch from the last
// committed offset: every message of that batch comes back to it and is a
// Duplicate, and the effects table has exactly N rows.
func TestRebalanceLeaveWithoutCommitWhileBatchInFlight(t *testing.T) {
	t.Parallel()
	const n = 120
	f := newEffectsFixture(t)

	type heldBatch struct {
		member string
		msgs   []idem.Message
	}
	held := make(chan heldBatch, 1)
	release := make(chan struct{})
	var holdOnce sync.Once
	// The first batch that commits (on either member) is held after its
	// transaction committed and before the adapter sees its outcomes.
	around := func(name string) func([]idem.Message, []idem.Outcome) {
		return func(msgs []idem.Message, outs []idem.Outcome) {
			for _, o := range outs {
				if o.Status != idem.Processed {
					return
				}
			}
			holdOnce.Do(func() {
				held <- heldBatch{name, msgs}
				<-release
			})
		}
	}
	cfg := func(name string) idemkafka.Config {
		return idemkafka.Config{BatchProcessor: f.batchProcessor(name, nil, around(name)), BatchSize: 10, Concurrency: 2,
			DeadLetter: f.dead, RetryDelay: 100 * time.Millisecond}
	}
	members := map[string]*member{
		"A": startMember(t, f.seeds, f.group, f.topic, cfg("A")),
		"B": startMember(t, f.seeds, f.group, f.topic, cfg("B")),
	}
	ids := f.publish("leave", n)

	var hb heldBatch
	select {
	case hb = <-held:
	case <-time.After(waitFor):
		t.Fatal("no batch was processed")
	}
	survivor := "A"
	if hb.member == "A" {
		survivor = "B"
	}
	members[hb.member].crash() // leaves the group, commits nothing more
	close(release)

	f.waitRows(ids)
	// Every message of the held batch was replayed to the survivor, as a
	// Duplicate.
	for _, m := range hb.msgs {
		testenv.Eventually(t, waitFor, "replay of "+m.ID+" to "+survivor, func() bool {
			return f.count(func(id string, o memberOutcome) bool {
				return id == m.ID && o.member == survivor && o.status == idem.Duplicate
			}) > 0
		}, func() string { return fmt.Sprintf("outcomes of %s: %v", m.ID, f.outcomesOf(m.ID)) })
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if err := members[survivor].stop(ctx); err != nil {
		t.Fatalf("stop %s: %v", survivor, err)
	}
	f.checkExactlyOnce(ids)
	if got := f.count(func(_ string, o memberOutcome) bool { return o.status == idem.Processed }); got != n {
		t.Errorf("%d Processed outcomes, want exactly %d", got, n)
	}
}

func (f *effectsFixture) outcomesOf(id string) []memberOutcome {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]memberOutcome(nil), f.outcomes[id]...)
}

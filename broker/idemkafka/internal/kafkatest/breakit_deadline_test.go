package kafkatest

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemkafka"
	"github.com/idem-go/idem/internal/testenv"
)

// TestBreakHandlerTimeoutAtDeadline: handlers that finish exactly when
// HandlerTimeout ends their context (they write their effect, wait for
// the context's end, then return success, their transaction's commit
// racing the deadline), on 40 records over the topic's partitions, so
// that several are in flight at once; a third of the records (every
// third) do so at their first attempt. In one-record mode (Processor) and
// in batch mode (BatchProcessor, up to 8 records a call, a batch holding
// such a record waiting as a whole); on the memory store (effects counted
// at commit) and on idemsql's SQLite (effects rows in the transaction,
// which database/sql ends with the context). Whatever each commit's
// outcome: every effect is made exactly once, every offset is committed,
// nothing is dead-lettered.
func TestBreakHandlerTimeoutAtDeadline(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"memory", "sqlite"} {
		for _, batch := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/batch=%v", store, batch), func(t *testing.T) {
				t.Parallel()
				handlerAtDeadline(t, store, batch)
			})
		}
	}
}

func handlerAtDeadline(t *testing.T, store string, batch bool) {
	topic, dead, group := uniqueName("deadline"), uniqueName("deadline-dead"), uniqueName("deadline-group")
	seeds := newCluster(t, topic, dead).ListenAddrs()
	p := idemkafka.NewProducer(newClient(t, seeds), idemkafka.ProducerConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	const n, timeout = 40, 200 * time.Millisecond
	for i := range n {
		id := fmt.Sprintf("d-%02d", i)
		if _, err := p.Publish(ctx, topic, []byte(id), idemkafka.WithMessageID(id), idemkafka.WithKey([]byte(id))); err != nil {
			t.Fatal(err)
		}
	}
	var (
		mu      sync.Mutex
		effects = map[string]int{} // memory: counted at commit
		calls   = map[string]int{}
	)
	// waits reports whether this call of msgs waits for its deadline.
	waits := func(msgs []idem.Message) bool {
		wait := false
		mu.Lock()
		defer mu.Unlock()
		for _, m := range msgs {
			calls[m.ID]++
			var i int
			_, _ = fmt.Sscanf(m.ID, "d-%d", &i)
			wait = wait || (i%3 == 0 && calls[m.ID] == 1)
		}
		return wait
	}
	cfg := idemkafka.Config{DeadLetter: dead, HandlerTimeout: timeout, RetryDelay: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)}
	if batch {
		cfg.BatchSize = 8
	}
	var count func(id string) int
	switch store {
	case "memory":
		ic, err := idem.NewConsumer[*idem.MemoryTx](idem.NewMemoryStore(nil), idem.Config{Name: "deadline", PurgeInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = ic.Close() }()
		h := func(ctx context.Context, tx *idem.MemoryTx, msgs []idem.Message) error {
			tx.OnCommit(func() {
				mu.Lock()
				defer mu.Unlock()
				for _, m := range msgs {
					effects[m.ID]++
				}
			})
			if waits(msgs) {
				<-ctx.Done() // exactly at the deadline, then success
			}
			return nil
		}
		cfg.Processor = idem.Bind(ic, func(ctx context.Context, tx *idem.MemoryTx, m idem.Message) error {
			return h(ctx, tx, []idem.Message{m})
		})
		cfg.BatchProcessor = idem.BindBatch(ic, h)
		count = func(id string) int { mu.Lock(); defer mu.Unlock(); return effects[id] }
	default:
		db, st := openSQLite(t)
		if _, err := db.Exec(`CREATE TABLE effects (id TEXT NOT NULL)`); err != nil {
			t.Fatal(err)
		}
		ic, err := idem.NewConsumer[*sql.Tx](st, idem.Config{Name: "deadline", PurgeInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = ic.Close() }()
		h := func(ctx context.Context, tx *sql.Tx, msgs []idem.Message) error {
			for _, m := range msgs {
				if _, err := tx.ExecContext(ctx, `INSERT INTO effects (id) VALUES (?)`, m.ID); err != nil {
					return err
				}
			}
			if waits(msgs) {
				<-ctx.Done() // exactly at the deadline, then success
			}
			return nil
		}
		cfg.Processor = idem.Bind(ic, func(ctx context.Context, tx *sql.Tx, m idem.Message) error { return h(ctx, tx, []idem.Message{m}) })
		cfg.BatchProcessor = idem.BindBatch(ic, h)
		count = func(id string) int {
			var c int
			if err := db.QueryRow(`SELECT count(*) FROM effects WHERE id = ?`, id).Scan(&c); err != nil {
				t.Fatal(err)
			}
			return c
		}
	}
	if batch {
		cfg.Processor = nil
	} else {
		cfg.BatchProcessor = nil
	}
	m := startMember(t, seeds, group, topic, cfg)
	done := func() int {
		k := 0
		for i := range n {
			if count(fmt.Sprintf("d-%02d", i)) > 0 {
				k++
			}
		}
		return k
	}
	testenv.Eventually(t, waitFor, "every record processed and committed", func() bool {
		return done() == n && groupLag(t, seeds, group, topic) == 0
	}, func() string {
		return fmt.Sprintf("%d of %d effects, lag %d", done(), n, groupLag(t, seeds, group, topic))
	})
	if err := m.stop(ctx); err != nil {
		t.Fatal(err)
	}
	again := 0
	for i := range n {
		id := fmt.Sprintf("d-%02d", i)
		if c := count(id); c != 1 {
			t.Errorf("%s: effect made %d times, want once", id, c)
		}
		mu.Lock()
		if calls[id] > 1 {
			again++
		}
		mu.Unlock()
	}
	t.Logf("%d of %d records handled again after a handler finished at its deadline", again, n)
	dls, err := deadLetters(ctx, seeds, dead)
	if err != nil || len(dls) != 0 {
		t.Errorf("%d dead letters (%v), want 0", len(dls), err)
	}
}

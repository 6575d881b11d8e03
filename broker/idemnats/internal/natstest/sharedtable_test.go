package natstest

import (
	"context"
	"database/sql"
	"github.com/idem-go/idem/internal/testenv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemnats"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Through JetStream: two physical copies of one logical message (distinct
// Nats-Msg-Id, so the server's dedupe does not hide them; the same
// application ID in another header), processed at once by two members of
// one durable consumer, run the handler once; and two consumers of one
// subject (billing, shipping) sharing one processed-messages table each
// process the event once, since the dedupe identity is (consumer name,
// message ID).
func TestCopiesAndConsumersShareOneTable(t *testing.T) {
	t.Parallel()
	conn := inProcess(t)
	_, js := newJS(t, conn)
	s := newStreams(t, js, time.Minute)
	ctx := context.Background()

	db, store := newSQLiteStore(t, "shared.db")
	if _, err := db.ExecContext(ctx, `CREATE TABLE effects (consumer TEXT NOT NULL, message_id TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}

	const idHeader = "App-Message-Id"
	var mu sync.Mutex
	calls := map[string]int{} // handler runs per consumer, outside the transaction (the "external counter")
	var settled atomic.Int32
	stops := []func(){}
	for _, name := range []string{"billing", "shipping"} {
		cons, err := s.stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
			Durable: name, FilterSubject: s.subject, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		ic, err := idem.NewConsumer[*sql.Tx](store, idem.Config{Name: name, PurgeInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ic.Close() })
		bound := idem.Bind(ic, func(ctx context.Context, tx *sql.Tx, msg idem.Message) error {
			mu.Lock()
			calls[name]++
			mu.Unlock()
			time.Sleep(200 * time.Millisecond) // the window in which a check-then-insert lets the copy in
			_, err := tx.ExecContext(ctx, `INSERT INTO effects (consumer, message_id) VALUES (?, ?)`, name, msg.ID)
			return err
		})
		counted := idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
			out, err := bound.Process(ctx, msg)
			if out.Ack() {
				settled.Add(1)
			}
			return out, err
		})
		// Two members of each durable consumer, two workers each.
		for range 2 {
			c, err := idemnats.NewConsumer(js, cons, idemnats.Config{
				Processor: counted, IDHeader: idHeader, Concurrency: 2, DeadLetter: s.dlSubject, Logger: testLogger(),
			})
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx) }()
			stops = append(stops, func() {
				sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				defer cancel()
				if err := c.Stop(sctx); err != nil {
					t.Errorf("Stop: %v", err)
				}
				if err := <-done; err != nil {
					t.Errorf("Run: %v", err)
				}
			})
		}
	}

	// Two copies of invoice-7 with distinct broker IDs, one payload.
	for i, brokerID := range []string{"copy-a", "copy-b"} {
		m := nats.NewMsg(s.subject)
		m.Data = []byte(`{"invoice":7}`)
		m.Header.Set(idHeader, "invoice-7")
		if _, err := js.PublishMsg(ctx, m, jetstream.WithMsgID(brokerID)); err != nil {
			t.Fatalf("publish copy %d: %v", i, err)
		}
	}
	testenv.Eventually(t, 60*time.Second, "4 deliveries (2 copies x 2 consumers) acknowledged", func() bool { return settled.Load() == 4 }, nil)
	for _, stop := range stops {
		stop()
	}

	for _, name := range []string{"billing", "shipping"} {
		var rows int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM effects WHERE consumer = ? AND message_id = 'invoice-7'`, name).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		n := calls[name]
		mu.Unlock()
		if rows != 1 || n != 1 {
			t.Errorf("%s: %d effect rows and %d handler runs for two copies of invoice-7, want 1 and 1 (the claim comes before the handler; each consumer once)", name, rows, n)
		}
	}
}

package gocdktest

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/store/idemsql"
	_ "modernc.org/sqlite"
)

// TestCrashRedelivery kills a member that holds a message without acking
// it (its connection cut and its context cancelled, as a killed process
// loses both), on mempubsub and on the Pub/Sub fake: once the 1s ack
// deadline lapses, the subscription delivers the message to a second
// member, and the effect happens once. Killed in the handler, the effect
// rolled back and the second member processes it; killed after the commit
// and before the ack, the second member finds it a Duplicate.
func TestCrashRedelivery(t *testing.T) {
	t.Parallel()
	fake := newPubsubFake(t)
	channels := map[string]func(t *testing.T) channel{
		"mem":    func(t *testing.T) channel { return memChannel(t, time.Second) },
		"pubsub": func(t *testing.T) channel { return fake.channel(t, time.Second) },
	}
	for name, newChannel := range channels {
		for _, tt := range []struct {
			name        string
			afterCommit bool
			want        idem.Status
		}{
			{name: "in-handler", want: idem.Processed},
			{name: "after-commit", afterCommit: true, want: idem.Duplicate},
		} {
			t.Run(name+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				b := newCDKBroker(t, newChannel(t))
				db, bound := effectsConsumer(t)
				ctx := t.Context()
				if err := b.Publish(ctx, "order-1", []byte(`{"amount":100}`)); err != nil {
					t.Fatal(err)
				}

				held := make(chan struct{})
				var m1 brokertest.Member
				m1Ready := make(chan struct{})
				p1 := idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
					<-m1Ready
					if !tt.afterCommit {
						close(held)
						<-ctx.Done() // killed in the handler: nothing committed
						return idem.Outcome{Status: idem.Failed, Err: ctx.Err()}, ctx.Err()
					}
					out, err := bound.Process(ctx, msg)
					m1.Crash() // before the adapter can ack
					close(held)
					return out, err
				})
				var err error
				m1, err = b.Start(ctx, p1, brokertest.StartOptions{Concurrency: 1, Redelivery: time.Second})
				if err != nil {
					t.Fatal(err)
				}
				close(m1Ready)
				select {
				case <-held:
				case <-time.After(90 * time.Second):
					t.Fatal("after 90s: member 1 never got the message")
				}
				if !tt.afterCommit {
					m1.Crash()
				}

				outcomes := make(chan idem.Status, 8)
				p2 := idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
					out, err := bound.Process(ctx, msg)
					outcomes <- out.Status
					return out, err
				})
				m2, err := b.Start(ctx, p2, brokertest.StartOptions{Concurrency: 1, Redelivery: time.Second})
				if err != nil {
					t.Fatal(err)
				}
				select {
				case got := <-outcomes:
					if got != tt.want {
						t.Errorf("member 2's outcome = %v, want %v", got, tt.want)
					}
				case <-time.After(90 * time.Second):
					t.Fatal("after 90s: the message was not redelivered to member 2")
				}
				stopCtx, cancel := context.WithTimeout(ctx, 90*time.Second)
				defer cancel()
				if err := m2.Stop(stopCtx); err != nil {
					t.Fatal(err)
				}
				var rows int
				if err := db.QueryRowContext(ctx, `SELECT count(*) FROM effects WHERE id = 'order-1'`).Scan(&rows); err != nil {
					t.Fatal(err)
				}
				if rows != 1 {
					t.Errorf("effect rows for order-1 = %d, want 1", rows)
				}
				if dl, err := b.DeadLetters(ctx); err != nil || len(dl) != 0 {
					t.Errorf("dead letters = %v (err %v), want none", dl, err)
				}
			})
		}
	}
}

// effectsConsumer returns a SQLite database with an effects table and the
// transactional Processor that inserts one row per message into it, in
// the claim's transaction.
func effectsConsumer(t *testing.T) (*sql.DB, idem.Processor) {
	t.Helper()
	ctx := t.Context()
	db, err := sql.Open("sqlite", idemsql.SQLiteDSN(filepath.Join(t.TempDir(), "effects.db")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	store, err := idemsql.New(db, idemsql.SQLite, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE effects (id TEXT PRIMARY KEY, payload BLOB)`); err != nil {
		t.Fatal(err)
	}
	c, err := idem.NewConsumer(store, idem.Config{Name: "crash"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return db, idem.Bind(c, func(ctx context.Context, tx *sql.Tx, m idem.Message) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO effects (id, payload) VALUES (?, ?)`, m.ID, m.Payload)
		return err
	})
}

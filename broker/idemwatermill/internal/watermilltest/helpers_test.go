// Package watermilltest holds idemwatermill's tests on real Watermill
// Pub/Subs (watermill-sql on PostgreSQL, watermill-amqp on RabbitMQ), its
// SIGKILL test and its benchmark against Watermill's Deduplicator: a
// module of its own, so that these test-only dependencies stay out of
// idemwatermill's go.mod and out of its users' module graphs.
package watermilltest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemwatermill"
	"github.com/idem-go/idem/store/idemsql"
)

const pgExample = "postgres://idem:idem@127.0.0.1:5432/idem_test?sslmode=disable"

const amqpExample = "amqp://guest:guest@127.0.0.1:5672/"

// quiet is the logger of the middleware under test: settlements at warn
// (every redelivery the tests provoke) would drown the test output.
var quiet = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))

// suffix returns a random name part, so that parallel tests and repeated
// runs on the shared server never meet.
func suffix() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// openPG opens the test PostgreSQL through database/sql (pgx's driver),
// migrates idem's tables, and creates a charges table without a unique
// key, so that an effect applied twice shows as two rows.
func openPG(tb testing.TB, url, charges string) (*sql.DB, *idemsql.Store) {
	tb.Helper()
	db, err := sql.Open("pgx", url)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	store, err := idemsql.New(db, idemsql.Postgres, nil)
	if err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()
	if err := store.Migrate(ctx); err != nil {
		tb.Fatal(err)
	}
	if charges != "" {
		if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+charges+` (message_id TEXT NOT NULL, payload TEXT NOT NULL)`); err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { db.ExecContext(context.Background(), `DROP TABLE IF EXISTS `+charges) })
	}
	return db, store
}

// chargeCounts returns the charges table's rows and distinct message IDs.
func chargeCounts(tb testing.TB, db *sql.DB, charges string) (rows, distinct int) {
	tb.Helper()
	err := db.QueryRow(`SELECT count(*), count(DISTINCT message_id) FROM `+charges).Scan(&rows, &distinct)
	if err != nil {
		tb.Fatal(err)
	}
	return rows, distinct
}

// failedPayload marks the row of a handler that then failed: it must have
// been rolled back with the claim.
const failedPayload = "failed attempt"

// charge is the handler every test wraps: it inserts one charges row with
// the transaction idem claimed the message in, then fails when f says so.
func charge(charges string, f *failOnce) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		tx, ok := idemwatermill.Tx[*sql.Tx](msg.Context())
		if !ok {
			return errors.New("no transaction in the message's context")
		}
		payload, fail := string(msg.Payload), f.fail(msg.UUID)
		if fail {
			payload = failedPayload
		}
		_, err := tx.ExecContext(msg.Context(), `INSERT INTO `+charges+` (message_id, payload) VALUES ($1, $2)`, msg.UUID, payload)
		if err == nil && fail {
			err = fmt.Errorf("injected failure of the first delivery of %s, after its row", msg.UUID)
		}
		return err
	}
}

// sqlPubSub returns a watermill-sql publisher and subscriber on db
// (PostgreSQL, the default schema with consumer-group offsets, batch
// messages a transaction; 0: watermill-sql's default, 100), polling fast
// so that the tests run quickly.
func sqlPubSub(tb testing.TB, db *sql.DB, group string, batch int) (message.Publisher, message.Subscriber) {
	tb.Helper()
	pub, err := wsql.NewPublisher(wsql.BeginnerFromStdSQL(db), wsql.PublisherConfig{
		SchemaAdapter: wsql.DefaultPostgreSQLSchema{SubscribeBatchSize: batch}, AutoInitializeSchema: true,
	}, watermill.NopLogger{})
	if err != nil {
		tb.Fatal(err)
	}
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db), wsql.SubscriberConfig{
		ConsumerGroup:    group,
		SchemaAdapter:    wsql.DefaultPostgreSQLSchema{SubscribeBatchSize: batch},
		OffsetsAdapter:   wsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true,
		PollInterval:     20 * time.Millisecond,
		ResendInterval:   20 * time.Millisecond,
		RetryInterval:    20 * time.Millisecond,
	}, watermill.NopLogger{})
	if err != nil {
		tb.Fatal(err)
	}
	return pub, sub
}

// subscriberTx is TransactionalIn's transaction source for watermill-sql:
// the transaction its subscriber consumes the message in.
func subscriberTx(ctx context.Context) (*sql.Tx, bool) {
	tx, ok := wsql.TxFromContext(ctx)
	std, isStd := tx.(*wsql.StdSQLTx)
	if !ok || !isStd {
		return nil, false
	}
	return std.Tx, true
}

// amqpConfig is a durable queue per topic, shared by every subscriber of
// it (competing consumers), nacked messages requeued.
func amqpConfig(url string) amqp.Config {
	return amqp.NewDurableQueueConfig(url)
}

// runRouter runs a Router with one consumer handler of topic on sub,
// wrapped in mws (outermost first), until the test ends; it returns once
// the handler is running.
func runRouter(tb testing.TB, sub message.Subscriber, topic string, h message.NoPublishHandlerFunc, mws ...message.HandlerMiddleware) {
	tb.Helper()
	runRouterOut(tb, sub, topic, nil, func(msg *message.Message) ([]*message.Message, error) { return nil, h(msg) }, mws...)
}

// output is where a handler's returned messages are published.
type output struct {
	topic string
	pub   message.Publisher
}

// runRouterOut is runRouter for a handler whose returned messages the
// Router publishes to out (nil: a handler that returns none).
func runRouterOut(tb testing.TB, sub message.Subscriber, topic string, out *output, h message.HandlerFunc, mws ...message.HandlerMiddleware) {
	tb.Helper()
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		tb.Fatal(err)
	}
	if out != nil {
		router.AddHandler("charge", topic, sub, out.topic, out.pub, h).AddMiddleware(mws...)
	} else {
		router.AddConsumerHandler("charge", topic, sub, func(msg *message.Message) error {
			_, err := h(msg)
			return err
		}).AddMiddleware(mws...)
	}
	done := make(chan error, 1)
	go func() { done <- router.Run(context.Background()) }()
	select {
	case <-router.Running():
	case err := <-done:
		tb.Fatalf("router: %v", err)
	}
	tb.Cleanup(func() {
		if err := router.Close(); err != nil {
			tb.Errorf("router close: %v", err)
		}
		<-done
	})
}

// publishAll publishes n JSON messages m-0 ... m-(n-1) on topic, and again
// every message whose index is a multiple of dupEvery (a producer's
// retry: same UUID, same payload).
func publishAll(tb testing.TB, pub message.Publisher, topic string, n, dupEvery int) {
	tb.Helper()
	for i := range n {
		copies := 1
		if dupEvery > 0 && i%dupEvery == 0 {
			copies = 2
		}
		for range copies {
			if err := pub.Publish(topic, message.NewMessage(fmt.Sprintf("m-%d", i), []byte(fmt.Sprintf(`{"n":%d}`, i)))); err != nil {
				tb.Fatal(err)
			}
		}
	}
}

// failOnce makes the first delivery of each listed message fail after
// its charge row was written, inside idem's transaction: the row and the
// claim roll back together and the Pub/Sub redelivers the nacked message.
type failOnce struct {
	mu   sync.Mutex
	ids  map[string]bool
	seen map[string]bool
}

func newFailOnce(ids ...string) *failOnce {
	f := &failOnce{ids: map[string]bool{}, seen: map[string]bool{}}
	for _, id := range ids {
		f.ids[id] = true
	}
	return f
}

// fail reports whether this delivery of id is to fail.
func (f *failOnce) fail(id string) bool {
	if f == nil {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	first := f.ids[id] && !f.seen[id]
	f.seen[id] = true
	return first
}

// transactional returns a function that takes what idem.NewConsumer
// returns and gives idemwatermill.Transactional over that Consumer, closed
// when tb ends.
func transactional[TTx any](tb testing.TB) func(*idem.Consumer[TTx], error) message.HandlerMiddleware {
	return func(c *idem.Consumer[TTx], err error) message.HandlerMiddleware {
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { c.Close() })
		mw, err := idemwatermill.Transactional(c, idemwatermill.Config{RetryDelay: 10 * time.Millisecond, Logger: quiet})
		if err != nil {
			tb.Fatal(err)
		}
		return mw
	}
}

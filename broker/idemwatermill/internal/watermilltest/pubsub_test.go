package watermilltest

import (
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemwatermill"
	"github.com/idem-go/idem/internal/testenv"
)

// countAcks returns a middleware, to add outermost, that counts the
// deliveries the Router is about to ack (the handler chain returned nil).
func countAcks(n *atomic.Int64) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil {
				n.Add(1)
			}
			return out, err
		}
	}
}

// waitAcks waits until acks reaches want, then checks that the charges
// table holds exactly one row for each of the n messages.
func waitAcks(t *testing.T, acks *atomic.Int64, want int64, db *sql.DB, charges string, n int) {
	t.Helper()
	testenv.Eventually(t, 2*time.Minute, fmt.Sprintf("%d acked deliveries", want), func() bool { return acks.Load() >= want },
		func() string {
			rows, _ := chargeCounts(t, db, charges)
			return fmt.Sprintf("%d acked, %d charge rows", acks.Load(), rows)
		})
	checkCharges(t, db, charges, n)
}

// checkCharges checks that the charges table holds exactly one row for
// each of the n messages, and none of a failed attempt.
func checkCharges(t *testing.T, db *sql.DB, charges string, n int) {
	t.Helper()
	rows, distinct := chargeCounts(t, db, charges)
	if rows != n || distinct != n {
		t.Fatalf("charges: %d rows for %d messages; want exactly one each (%d)", rows, distinct, n)
	}
	var failed int
	if err := db.QueryRow(`SELECT count(*) FROM `+charges+` WHERE payload = $1`, failedPayload).Scan(&failed); err != nil {
		t.Fatal(err)
	}
	if failed != 0 {
		t.Fatalf("charges: %d rows of failed attempts committed; want 0", failed)
	}
}

// watermill-sql on PostgreSQL, two replicas of the consumer group, with
// TransactionalIn: the claim and the charge row join the transaction the
// subscriber consumes the message in (a batch of up to 100 messages per
// transaction, watermill-sql's default), committed with its ack. A fifth
// of the messages are published twice, some handlers fail once after
// writing their row (sent again by the subscriber in the same
// transaction): each message is charged exactly once, no failed attempt's
// row is committed, and every delivery is acked in the end.
func TestSQLPubSubSubscriberTransaction(t *testing.T) {
	t.Parallel()
	url := testenv.URL(t, testenv.PostgresEnv, pgExample)
	id := suffix()
	charges, topic := "wm_charges_"+id, "wm_pay_"+id
	db, store := openPG(t, url, charges)
	c, err := idem.NewConsumer(store, idem.Config{Name: "wm-sql-" + id})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	idempotent, err := idemwatermill.TransactionalIn(c, subscriberTx, idemwatermill.Config{RetryDelay: 10 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	const n, dupEvery = 100, 5
	pub, _ := sqlPubSub(t, db, "g", 0)
	publishAll(t, pub, topic, n, dupEvery)
	fails := newFailOnce("m-3", "m-10", "m-51", "m-99")
	var acks atomic.Int64
	for range 2 {
		_, sub := sqlPubSub(t, db, "g", 0)
		runRouter(t, sub, topic, charge(charges, fails), countAcks(&acks), idempotent)
	}
	waitAcks(t, &acks, n+n/dupEvery, db, charges, n)
	var claimed int
	if err := db.QueryRow(`SELECT count(*) FROM idem_processed WHERE consumer_key = (SELECT key FROM idem_processed_consumers WHERE name = $1)`, "wm-sql-"+id).Scan(&claimed); err != nil {
		t.Fatal(err)
	}
	if claimed != n {
		t.Fatalf("idem_processed holds %d claims; want %d", claimed, n)
	}
}

// watermill-amqp on RabbitMQ, two competing routers on one durable queue,
// with Transactional (idem's own transaction on PostgreSQL): duplicates
// published by the producer and handlers failing once are charged exactly
// once. The handler also publishes a receipt with a watermill-sql
// Publisher on idem's transaction (an outbox in Watermill's terms): the
// receipts, failed attempts' included, are committed exactly once too.
func TestAMQPTransactional(t *testing.T) {
	t.Parallel()
	pgURL := testenv.URL(t, testenv.PostgresEnv, pgExample)
	amqpURL := testenv.URL(t, testenv.AMQPEnv, amqpExample)
	id := suffix()
	charges, topic := "wm_charges_"+id, "wm-pay-"+id
	db, store := openPG(t, pgURL, charges)
	idempotent := transactional[*sql.Tx](t)(idem.NewConsumer(store, idem.Config{Name: "wm-amqp-" + id}))
	fails := newFailOnce("m-3", "m-10", "m-51", "m-99")
	receipts := "wm_receipts_" + id
	_, receiptsSub := sqlPubSub(t, db, "g", 0)
	if err := receiptsSub.(*wsql.Subscriber).SubscribeInitialize(receipts); err != nil {
		t.Fatal(err)
	}
	chargeRow := charge(charges, fails)
	handler := func(msg *message.Message) error {
		tx, _ := idemwatermill.Tx[*sql.Tx](msg.Context())
		out, err := wsql.NewPublisher(wsql.TxFromStdSQL(tx), wsql.PublisherConfig{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}}, watermill.NopLogger{})
		if err != nil {
			return err
		}
		if err := out.Publish(receipts, message.NewMessage("receipt-"+msg.UUID, msg.Payload)); err != nil {
			return err
		}
		return chargeRow(msg)
	}
	var acks atomic.Int64
	for range 2 {
		sub, err := amqp.NewSubscriber(amqpConfig(amqpURL), watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		runRouter(t, sub, topic, handler, countAcks(&acks), idempotent)
	}
	pub, err := amqp.NewPublisher(amqpConfig(amqpURL), watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	const n, dupEvery = 100, 5
	publishAll(t, pub, topic, n, dupEvery)
	waitAcks(t, &acks, n+n/dupEvery, db, charges, n)
	var rows, distinct int
	if err := db.QueryRow(`SELECT count(*), count(DISTINCT uuid) FROM "watermill_`+receipts+`"`).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	if rows != n || distinct != n {
		t.Fatalf("receipts: %d rows for %d messages; want exactly one each (%d)", rows, distinct, n)
	}
}

// provider is an external payment API that deduplicates by idempotency
// key, as lease mode asks of external effects.
type provider struct {
	mu    sync.Mutex
	calls int
	byKey map[string]string // idempotency key -> message UUID
}

func (p *provider) charge(key, msgID string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	p.byKey[key] = msgID
}

// watermill-amqp with Lease (lease mode, the record on PostgreSQL, the
// effect at an external provider keyed by Attempt.Key): a handler that
// fails after its call is retried with the same key, and the duplicates
// are not called at all; every message's charge has one key.
func TestAMQPLease(t *testing.T) {
	t.Parallel()
	pgURL := testenv.URL(t, testenv.PostgresEnv, pgExample)
	amqpURL := testenv.URL(t, testenv.AMQPEnv, amqpExample)
	id := suffix()
	topic := "wm-mail-" + id
	_, store := openPG(t, pgURL, "")
	lc, err := idem.NewLeaseConsumer(store, idem.Config{Name: "wm-lease-" + id, Lease: 10 * time.Second, PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	idempotent, err := idemwatermill.Lease(lc, idemwatermill.Config{RetryDelay: 10 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	p := &provider{byKey: map[string]string{}}
	fails := newFailOnce("m-2", "m-20", "m-33")
	handler := func(msg *message.Message) error {
		a := idemwatermill.Attempt(msg.Context())
		p.charge(a.Key("charge"), msg.UUID)
		if fails.fail(msg.UUID) {
			return fmt.Errorf("injected failure after the provider's call for %s", msg.UUID)
		}
		return nil
	}
	var acks atomic.Int64
	sub, err := amqp.NewSubscriber(amqpConfig(amqpURL), watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	runRouter(t, sub, topic, handler, countAcks(&acks), idempotent)
	pub, err := amqp.NewPublisher(amqpConfig(amqpURL), watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	const n, dupEvery = 50, 5
	publishAll(t, pub, topic, n, dupEvery)
	testenv.Eventually(t, 2*time.Minute, "every delivery acked", func() bool { return acks.Load() >= n+n/dupEvery }, nil)
	p.mu.Lock()
	defer p.mu.Unlock()
	perMsg := map[string]int{}
	for _, m := range p.byKey {
		perMsg[m]++
	}
	if len(perMsg) != n || len(p.byKey) != n {
		t.Fatalf("provider: %d keys for %d messages; want one key per message (%d)", len(p.byKey), len(perMsg), n)
	}
	if p.calls != n+3 {
		t.Fatalf("provider called %d times; want %d (each message once, the 3 failed ones once more with the same key)", p.calls, n+3)
	}
}

// TransactionalIn on a message whose context holds no transaction (a
// Pub/Sub other than watermill-sql): Failed with idem.ErrInvalidConfig,
// nacked, the handler not run.
func TestTransactionalInWithoutTransaction(t *testing.T) {
	url := testenv.URL(t, testenv.PostgresEnv, pgExample)
	_, store := openPG(t, url, "")
	c, err := idem.NewConsumer(store, idem.Config{Name: "wm-notx-" + suffix()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mw, err := idemwatermill.TransactionalIn(c, subscriberTx, idemwatermill.Config{RetryDelay: time.Nanosecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	h := mw(func(*message.Message) ([]*message.Message, error) {
		t.Error("the handler ran without a transaction")
		return nil, nil
	})
	_, err = h(message.NewMessage("m-1", []byte(`{}`)))
	if !errors.Is(err, idem.ErrInvalidConfig) || idemwatermill.ShouldDeadLetter(err) {
		t.Fatalf("got %v; want a redeliver error matching ErrInvalidConfig", err)
	}
}

// watermill-amqp with Watermill's PoisonQueueWithFilter and
// ShouldDeadLetter: a message without an ID, one with an invalid ID, the
// same ID with another payload and a handler's idem.Permanent error each
// reach the poison queue once, with idem's reason in its metadata, and are
// acked there (never redelivered); none has a charge row, and the
// permanently failing handler ran once. The valid message is charged once.
func TestAMQPPoisonQueue(t *testing.T) {
	t.Parallel()
	pgURL := testenv.URL(t, testenv.PostgresEnv, pgExample)
	amqpURL := testenv.URL(t, testenv.AMQPEnv, amqpExample)
	id := suffix()
	charges, topic, poison := "wm_charges_"+id, "wm-bad-"+id, "wm-bad-"+id+".poison"
	db, store := openPG(t, pgURL, charges)
	idempotent := transactional[*sql.Tx](t)(idem.NewConsumer(store, idem.Config{Name: "wm-bad-" + id}))
	pub, err := amqp.NewPublisher(amqpConfig(amqpURL), watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	pq, err := middleware.PoisonQueueWithFilter(pub, poison, idemwatermill.ShouldDeadLetter)
	if err != nil {
		t.Fatal(err)
	}
	poisonSub, err := amqp.NewSubscriber(amqpConfig(amqpURL), watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer poisonSub.Close()
	poisoned, err := poisonSub.Subscribe(t.Context(), poison)
	if err != nil {
		t.Fatal(err)
	}
	var permanentRuns atomic.Int32
	chargeRow := charge(charges, nil)
	handler := func(msg *message.Message) error {
		if msg.UUID == "m-permanent" {
			permanentRuns.Add(1)
			return idem.Permanent(errors.New("card declined"))
		}
		return chargeRow(msg)
	}
	sub, err := amqp.NewSubscriber(amqpConfig(amqpURL), watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	var acks atomic.Int64
	runRouter(t, sub, topic, handler, countAcks(&acks), pq, idempotent)
	sent := []struct{ uuid, payload, reason string }{
		{"m-1", `{"n":1}`, ""},
		{"", `{"n":2}`, idem.ReasonMissingMessageID},
		{"bad\x01id", `{"n":3}`, idem.ReasonInvalidMessageID},
		{"m-1", `{"n":999}`, idem.ReasonFingerprintMismatch},
		{"m-permanent", `{"n":4}`, idem.ReasonPermanent},
	}
	want := map[string]string{} // payload -> reason
	for _, s := range sent {
		if err := pub.Publish(topic, message.NewMessage(s.uuid, []byte(s.payload))); err != nil {
			t.Fatal(err)
		}
		if s.reason != "" {
			want[s.payload] = s.reason
		}
	}
	got := map[string]string{}
	timeout := time.After(time.Minute)
	for len(got) < len(want) {
		select {
		case m := <-poisoned:
			got[string(m.Payload)] = m.Metadata.Get(idem.HeaderDeadLetterReason)
			m.Ack()
		case <-timeout:
			t.Fatalf("poison queue after a minute: %v; want %v", got, want)
		}
	}
	for payload, reason := range want {
		if got[payload] != reason {
			t.Errorf("poisoned %s: reason %q; want %q", payload, got[payload], reason)
		}
	}
	// Every delivery was acked by the Router: the poison queue's ack of
	// the four and the charge of m-1; none comes back.
	testenv.Eventually(t, time.Minute, "5 deliveries acked", func() bool { return acks.Load() >= int64(len(sent)) }, nil)
	if rows, distinct := chargeCounts(t, db, charges); rows != 1 || distinct != 1 {
		t.Fatalf("charges: %d rows, %d messages; want m-1 once", rows, distinct)
	}
	if n := permanentRuns.Load(); n != 1 {
		t.Fatalf("the permanently failing handler ran %d times; want 1", n)
	}
}

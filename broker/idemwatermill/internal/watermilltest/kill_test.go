package watermilltest

import (
	"bufio"
	"bytes"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemwatermill"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/idemsql"
)

// Environment of the consumer process TestKillHelper runs.
const (
	envHelper   = "IDEM_WM_KILL_HELPER" // "1" in the helper process
	envKind     = "IDEM_WM_KIND"        // a key of kinds
	envTopic    = "IDEM_WM_TOPIC"
	envCharges  = "IDEM_WM_CHARGES"
	envConsumer = "IDEM_WM_CONSUMER"
	envHold     = "IDEM_WM_HOLD"       // the UUID of the message to stop at
	envHoldAt   = "IDEM_WM_HOLD_WHERE" // "inside" the handler, or "after" idem's middleware returned
)

// kind is one Pub/Sub the kill test runs on, with the middleware its
// users would pick.
type kind struct {
	// sub returns a new subscriber of the kind.
	sub func(tb testing.TB, db *sql.DB) message.Subscriber
	// pub returns a publisher of the kind.
	pub func(tb testing.TB, db *sql.DB) message.Publisher
	// middleware is idem's middleware over store, for consumer.
	middleware func(tb testing.TB, store *idemsql.Store, consumer string) message.HandlerMiddleware
	// handler is the handler it wraps: charge, unless set.
	handler func(db *sql.DB, charges string) message.HandlerFunc
	// receipts is whether the handler returns a receipt for each message,
	// which the Router publishes to the topic's "-receipts" queue.
	receipts bool
	// inside and after are the charge rows of a message whose consumer
	// was killed inside its handler, and after idem's middleware returned
	// (before the Router's ack): 0 when rolled back, 1 when committed.
	inside, after int
}

// kinds are the kill test's Pub/Subs and modes: watermill-sql with
// TransactionalIn, watermill-amqp with Transactional, and watermill-amqp
// with Lease, whose handler charges an external provider that keeps one
// charge per idempotency key (Attempt.Key): its rows are the provider's
// calls, its payload the key.
func kinds(tb testing.TB) map[string]kind {
	amqpSub := func(tb testing.TB, _ *sql.DB) message.Subscriber {
		s, err := amqp.NewSubscriber(amqpConfig(testenv.URL(tb, testenv.AMQPEnv, amqpExample)), watermill.NopLogger{})
		if err != nil {
			tb.Fatal(err)
		}
		return s
	}
	amqpPub := func(tb testing.TB, _ *sql.DB) message.Publisher {
		p, err := amqp.NewPublisher(amqpConfig(testenv.URL(tb, testenv.AMQPEnv, amqpExample)), watermill.NopLogger{})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { p.Close() })
		return p
	}
	return map[string]kind{
		"sql": {
			sub: func(tb testing.TB, db *sql.DB) message.Subscriber { _, s := sqlPubSub(tb, db, "g", 1); return s },
			pub: func(tb testing.TB, db *sql.DB) message.Publisher { p, _ := sqlPubSub(tb, db, "g", 1); return p },
			middleware: func(tb testing.TB, store *idemsql.Store, consumer string) message.HandlerMiddleware {
				c, err := idem.NewConsumer(store, idem.Config{Name: consumer})
				if err != nil {
					tb.Fatal(err)
				}
				tb.Cleanup(func() { c.Close() })
				mw, err := idemwatermill.TransactionalIn(c, subscriberTx, idemwatermill.Config{RetryDelay: 10 * time.Millisecond, Logger: quiet})
				if err != nil {
					tb.Fatal(err)
				}
				return mw
			},
		},
		"amqp": {
			sub: amqpSub,
			pub: amqpPub,
			middleware: func(tb testing.TB, store *idemsql.Store, consumer string) message.HandlerMiddleware {
				return transactional[*sql.Tx](tb)(idem.NewConsumer(store, idem.Config{Name: consumer}))
			},
			after: 1,
		},
		"amqp-lease": {
			sub: amqpSub,
			pub: amqpPub,
			middleware: func(tb testing.TB, store *idemsql.Store, consumer string) message.HandlerMiddleware {
				// A short lease, so that the next consumer takes over the
				// killed one's message soon.
				lc, err := idem.NewLeaseConsumer(store, idem.Config{Name: consumer, Lease: 2 * time.Second, PurgeInterval: -1})
				if err != nil {
					tb.Fatal(err)
				}
				tb.Cleanup(func() { lc.Close() })
				mw, err := idemwatermill.Lease(lc, idemwatermill.Config{RetryDelay: 10 * time.Millisecond, Logger: quiet})
				if err != nil {
					tb.Fatal(err)
				}
				return mw
			},
			handler: func(db *sql.DB, charges string) message.HandlerFunc {
				return func(msg *message.Message) ([]*message.Message, error) {
					key := idemwatermill.Attempt(msg.Context()).Key("charge")
					if _, err := db.ExecContext(msg.Context(), `INSERT INTO `+charges+` (message_id, payload) VALUES ($1, $2)`, msg.UUID, key); err != nil {
						return nil, err
					}
					return []*message.Message{message.NewMessage("receipt-"+msg.UUID, []byte(`{}`))}, nil
				}
			},
			receipts: true,
			inside:   1, // the provider was called
			after:    1,
		},
	}
}

// handlerOn returns k's handler on db's charges table.
func (k kind) handlerOn(db *sql.DB, charges string) message.HandlerFunc {
	if k.handler == nil {
		h := charge(charges, nil)
		return func(msg *message.Message) ([]*message.Message, error) { return nil, h(msg) }
	}
	return k.handler(db, charges)
}

// outputOf returns where k's receipts for topic go (nil: none).
func (k kind) outputOf(tb testing.TB, db *sql.DB, topic string) *output {
	if !k.receipts {
		return nil
	}
	return &output{topic: topic + "-receipts", pub: k.pub(tb, db)}
}

// holdLine is what the helper prints when it stops at the held message.
func holdLine(where, id string) string { return "HOLD " + where + " " + id }

// TestKillHelper is the consumer process of TestKillConsumer: a Router
// over the Pub/Sub its environment names, charging messages through idem
// until it reaches the held message, where it prints holdLine and waits
// to be killed. It does nothing in a normal run.
func TestKillHelper(t *testing.T) {
	if os.Getenv(envHelper) != "1" {
		t.Skip("the consumer process of TestKillConsumer")
	}
	k := kinds(t)[os.Getenv(envKind)]
	charges, hold, where := os.Getenv(envCharges), os.Getenv(envHold), os.Getenv(envHoldAt)
	db, store := openPG(t, testenv.URL(t, testenv.PostgresEnv, pgExample), "")
	stop := func(at string) {
		fmt.Println(holdLine(at, hold))
		select {} // until SIGKILL
	}
	inner := k.handlerOn(db, charges)
	handler := func(msg *message.Message) ([]*message.Message, error) {
		out, err := inner(msg)
		if err == nil && where == "inside" && msg.UUID == hold {
			stop("inside")
		}
		return out, err
	}
	after := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil && where == "after" && msg.UUID == hold {
				stop("after")
			}
			return out, err
		}
	}
	topic := os.Getenv(envTopic)
	runRouterOut(t, k.sub(t, db), topic, k.outputOf(t, db, topic), handler, after, k.middleware(t, store, os.Getenv(envConsumer)))
	select {}
}

// runUntilKilled runs TestKillHelper in a new process, waits for it to
// print its hold line, and SIGKILLs it.
func runUntilKilled(t *testing.T, env []string, where, id string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestKillHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), append(env, envHelper+"=1", envHold+"="+id, envHoldAt+"="+where)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	held := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.TrimSpace(sc.Text()) == holdLine(where, id) {
				held <- true
				return
			}
		}
		held <- false
	}()
	select {
	case ok := <-held:
		if !ok {
			_ = cmd.Wait()
			t.Fatalf("the consumer process ended before holding %s: %s", id, stderr.String())
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("the consumer process did not reach %s in 2 minutes: %s", id, stderr.String())
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
}

// rowsOf returns how many charge rows message id has.
func rowsOf(t *testing.T, db *sql.DB, charges, id string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM `+charges+` WHERE message_id = $1`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestKillConsumer SIGKILLs a consumer process twice on each Pub/Sub and
// mode: once inside the handler of m-10 (its row written, uncommitted),
// once after idem's middleware returned for m-25 and before the Router's
// ack (on watermill-sql the claim and the row are in the subscriber's
// transaction, not committed yet; on RabbitMQ idem's transaction, or the
// lease's completion, has committed and the message is unacked). A third
// consumer, in this process, takes over the rest: every message is
// charged exactly once, duplicates published by the producer included;
// in lease mode the provider may be called again for m-10, with the same
// idempotency key.
func TestKillConsumer(t *testing.T) {
	pgURL := testenv.URL(t, testenv.PostgresEnv, pgExample)
	for _, name := range []string{"sql", "amqp", "amqp-lease"} {
		t.Run(name, func(t *testing.T) {
			if name != "sql" {
				testenv.URL(t, testenv.AMQPEnv, amqpExample)
			}
			k := kinds(t)[name]
			id := suffix()
			charges, topic, consumer := "wm_charges_"+id, "wm_kill_"+id, "wm-kill-"+id
			db, store := openPG(t, pgURL, charges)
			env := []string{envKind + "=" + name, envTopic + "=" + topic, envCharges + "=" + charges, envConsumer + "=" + consumer}
			const n, dupEvery = 42, 4 // m-41, the last, is published once
			if name != "sql" {
				// The queue must exist before the messages are published
				// to it: a subscriber declares it.
				s := k.sub(t, db)
				if _, err := s.Subscribe(t.Context(), topic); err != nil {
					t.Fatal(err)
				}
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
			}
			receipts := collect(t, k, db, topic)
			publishAll(t, k.pub(t, db), topic, n, dupEvery)

			runUntilKilled(t, env, "inside", "m-10")
			if got := rowsOf(t, db, charges, "m-10"); got != k.inside {
				t.Fatalf("m-10, killed inside its handler, has %d rows; want %d", got, k.inside)
			}
			runUntilKilled(t, env, "after", "m-25")
			if got := rowsOf(t, db, charges, "m-25"); got != k.after {
				t.Fatalf("m-25, killed before its ack, has %d rows; want %d", got, k.after)
			}

			last := make(chan struct{})
			var lastOnce sync.Once
			seenLast := func(h message.HandlerFunc) message.HandlerFunc {
				return func(msg *message.Message) ([]*message.Message, error) {
					out, err := h(msg)
					if err == nil && msg.UUID == fmt.Sprintf("m-%d", n-1) {
						lastOnce.Do(func() { close(last) })
					}
					return out, err
				}
			}
			runRouterOut(t, k.sub(t, db), topic, k.outputOf(t, db, topic), k.handlerOn(db, charges), seenLast, k.middleware(t, store, consumer))
			select {
			case <-last:
			case <-time.After(2 * time.Minute):
				t.Fatal("the last message was not acked in 2 minutes")
			}
			var rows, messages, charged int
			testenv.Eventually(t, time.Minute, "every charge committed", func() bool {
				// charged: distinct (message, payload) pairs; the payload
				// is the message's own, or in lease mode the idempotency
				// key, of which each message must have one.
				err := db.QueryRow(`SELECT count(*), count(DISTINCT message_id), count(DISTINCT (message_id, payload)) FROM `+charges).Scan(&rows, &messages, &charged)
				if err != nil {
					t.Fatal(err)
				}
				return messages >= n
			}, nil)
			t.Logf("%s: %d messages (%d deliveries published), 2 consumers SIGKILLed: %d charges of %d messages, %d rows (handler calls that committed or reached the provider)",
				name, n, n+(n+dupEvery-1)/dupEvery, charged, messages, rows)
			if messages != n || charged != n {
				t.Fatalf("%d charges of %d messages; want exactly one each (%d)", charged, messages, n)
			}
			if k.handler == nil && rows != n {
				t.Fatalf("%d charge rows for %d messages; want exactly one each", rows, n)
			}
			if receipts != nil {
				testenv.Eventually(t, time.Minute, "a receipt for every message", func() bool { return receipts.distinct() >= n }, nil)
				t.Logf("%s: receipts of %d messages published, %d in all (the duplicates' replays included)", name, receipts.distinct(), receipts.total())
			}
		})
	}
}

// receiptSet counts the receipts a kind's handlers returned and the Router
// published.
type receiptSet struct {
	mu   sync.Mutex
	seen map[string]int
}

func (r *receiptSet) distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seen)
}

func (r *receiptSet) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.seen {
		n += c
	}
	return n
}

// collect subscribes to k's receipts for topic, when k has any, and
// counts them until the test ends.
func collect(t *testing.T, k kind, db *sql.DB, topic string) *receiptSet {
	if !k.receipts {
		return nil
	}
	sub := k.sub(t, db)
	msgs, err := sub.Subscribe(t.Context(), topic+"-receipts")
	if err != nil {
		t.Fatal(err)
	}
	r := &receiptSet{seen: map[string]int{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range msgs {
			r.mu.Lock()
			r.seen[m.UUID]++
			r.mu.Unlock()
			m.Ack()
		}
	}()
	t.Cleanup(func() {
		sub.Close()
		<-done
	})
	return r
}

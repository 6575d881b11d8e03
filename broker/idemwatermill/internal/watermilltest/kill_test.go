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
)

// Environment of the consumer process TestKillHelper runs.
const (
	envHelper   = "IDEM_WM_KILL_HELPER" // "1" in the helper process
	envKind     = "IDEM_WM_KIND"        // "sql" or "amqp"
	envTopic    = "IDEM_WM_TOPIC"
	envCharges  = "IDEM_WM_CHARGES"
	envConsumer = "IDEM_WM_CONSUMER"
	envHold     = "IDEM_WM_HOLD"       // the UUID of the message to stop at
	envHoldAt   = "IDEM_WM_HOLD_WHERE" // "inside" the handler, or "after" idem's middleware returned
)

// kind is one Pub/Sub the kill test runs on, with the middleware its
// users would pick.
type kind struct {
	name string
	// sub returns a new subscriber of the kind.
	sub func(tb testing.TB, db *sql.DB) message.Subscriber
	// pub returns a publisher of the kind.
	pub func(tb testing.TB, db *sql.DB) message.Publisher
	// middleware is idem's middleware over store.
	middleware func(tb testing.TB, c *idem.Consumer[*sql.Tx]) message.HandlerMiddleware
	// committedAfter is whether a message held after idem's middleware
	// returned has its row committed (idem's own transaction) or not yet
	// (the subscriber's transaction, committed with the ack).
	committedAfter bool
}

func kinds(tb testing.TB) map[string]kind {
	return map[string]kind{
		"sql": {
			name: "sql",
			sub:  func(tb testing.TB, db *sql.DB) message.Subscriber { _, s := sqlPubSub(tb, db, "g", 1); return s },
			pub:  func(tb testing.TB, db *sql.DB) message.Publisher { p, _ := sqlPubSub(tb, db, "g", 1); return p },
			middleware: func(tb testing.TB, c *idem.Consumer[*sql.Tx]) message.HandlerMiddleware {
				mw, err := idemwatermill.TransactionalIn(c, subscriberTx, idemwatermill.Config{RetryDelay: 10 * time.Millisecond, Logger: quiet})
				if err != nil {
					tb.Fatal(err)
				}
				return mw
			},
		},
		"amqp": {
			name: "amqp",
			sub: func(tb testing.TB, _ *sql.DB) message.Subscriber {
				s, err := amqp.NewSubscriber(amqpConfig(testenv.URL(tb, testenv.AMQPEnv, amqpExample)), watermill.NopLogger{})
				if err != nil {
					tb.Fatal(err)
				}
				return s
			},
			pub: func(tb testing.TB, _ *sql.DB) message.Publisher {
				p, err := amqp.NewPublisher(amqpConfig(testenv.URL(tb, testenv.AMQPEnv, amqpExample)), watermill.NopLogger{})
				if err != nil {
					tb.Fatal(err)
				}
				tb.Cleanup(func() { p.Close() })
				return p
			},
			middleware: func(tb testing.TB, c *idem.Consumer[*sql.Tx]) message.HandlerMiddleware {
				return transactional[*sql.Tx](tb)(c, nil)
			},
			committedAfter: true,
		},
	}
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
	c, err := idem.NewConsumer(store, idem.Config{Name: os.Getenv(envConsumer)})
	if err != nil {
		t.Fatal(err)
	}
	stop := func(at string) {
		fmt.Println(holdLine(at, hold))
		select {} // until SIGKILL
	}
	handler := func(msg *message.Message) error {
		if err := charge(charges, nil)(msg); err != nil {
			return err
		}
		if where == "inside" && msg.UUID == hold {
			stop("inside")
		}
		return nil
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
	runRouter(t, k.sub(t, db), os.Getenv(envTopic), handler, after, k.middleware(t, c))
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

// TestKillConsumer SIGKILLs a consumer process twice on each Pub/Sub:
// once inside the handler of m-10 (its row written, uncommitted), once
// after idem's middleware returned for m-25 and before the Router's ack (on
// watermill-sql the claim and the row are in the subscriber's transaction,
// not committed yet; on RabbitMQ idem's transaction has committed and
// the message is unacked). A third consumer, in this process, takes over
// the rest: every message is charged exactly once, duplicates published by
// the producer included.
func TestKillConsumer(t *testing.T) {
	pgURL := testenv.URL(t, testenv.PostgresEnv, pgExample)
	for _, name := range []string{"sql", "amqp"} {
		t.Run(name, func(t *testing.T) {
			if name == "amqp" {
				testenv.URL(t, testenv.AMQPEnv, amqpExample)
			}
			k := kinds(t)[name]
			id := suffix()
			charges, topic, consumer := "wm_charges_"+id, "wm_kill_"+id, "wm-kill-"+id
			db, store := openPG(t, pgURL, charges)
			env := []string{envKind + "=" + name, envTopic + "=" + topic, envCharges + "=" + charges, envConsumer + "=" + consumer}
			const n, dupEvery = 42, 4 // m-41, the last, is published once
			if name == "amqp" {
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
			publishAll(t, k.pub(t, db), topic, n, dupEvery)

			runUntilKilled(t, env, "inside", "m-10")
			if got := rowsOf(t, db, charges, "m-10"); got != 0 {
				t.Fatalf("m-10, killed inside its handler, has %d rows; want 0 (rolled back)", got)
			}
			r1, _ := chargeCounts(t, db, charges)
			runUntilKilled(t, env, "after", "m-25")
			r2, _ := chargeCounts(t, db, charges)
			t.Logf("rows after the first kill: %d, after the second: %d", r1, r2)
			want := 0
			if k.committedAfter {
				want = 1
			}
			if got := rowsOf(t, db, charges, "m-25"); got != want {
				t.Fatalf("m-25, killed before its ack, has %d rows; want %d", got, want)
			}

			c, err := idem.NewConsumer(store, idem.Config{Name: consumer})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
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
			runRouter(t, k.sub(t, db), topic, charge(charges, nil), seenLast, k.middleware(t, c))
			select {
			case <-last:
			case <-time.After(2 * time.Minute):
				t.Fatal("the last message was not acked in 2 minutes")
			}
			testenv.Eventually(t, time.Minute, "every charge committed", func() bool { rows, _ := chargeCounts(t, db, charges); return rows >= n }, nil)
			rows, distinct := chargeCounts(t, db, charges)
			t.Logf("%s: %d messages (%d deliveries published), 2 consumers SIGKILLed: %d charge rows, %d distinct", name, n, n+(n+dupEvery-1)/dupEvery, rows, distinct)
			if rows != n || distinct != n {
				t.Fatalf("charges: %d rows for %d messages; want exactly one each (%d)", rows, distinct, n)
			}
		})
	}
}

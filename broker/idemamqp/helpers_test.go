package idemamqp_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"github.com/idem-go/idem/internal/testenv"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// testURL returns the RabbitMQ URL, skipping the test when it is not set
// (failing it under IDEM_TEST_REQUIRE_ALL=1).
func testURL(tb testing.TB) string {
	tb.Helper()
	return testenv.URL(tb, testenv.AMQPEnv, "amqp://guest:guest@127.0.0.1:5672/")
}

// quiet is the logger of consumers under test: warnings only, to stderr
// only when -v.
func quiet() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func randName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// tapConn is a connection whose TCP socket the test can cut, as a
// network failure or a killed process would: no connection.close reaches
// the broker, which notices the lost socket and requeues the unacked
// deliveries.
type tapConn struct {
	*amqp.Connection
	mu   sync.Mutex
	sock net.Conn
}

// cut closes the socket abruptly.
func (t *tapConn) cut() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sock != nil {
		if tcp, ok := t.sock.(*net.TCPConn); ok {
			_ = tcp.SetLinger(0) // RST, not FIN
		}
		_ = t.sock.Close()
	}
}

// dial opens a connection to the test broker named name (visible in
// rabbitmqctl list_connections), closed at cleanup.
func dial(tb testing.TB, name string) *tapConn {
	tb.Helper()
	t, err := dialTap(testURL(tb), name)
	if err != nil {
		tb.Fatalf("dial RabbitMQ: %v", err)
	}
	tb.Cleanup(func() { _ = t.Close() })
	return t
}

func dialTap(url, name string) (*tapConn, error) {
	t := &tapConn{}
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(name)
	conn, err := amqp.DialConfig(url, amqp.Config{
		Properties: props,
		Dial: func(network, addr string) (net.Conn, error) {
			c, err := net.DialTimeout(network, addr, 10*time.Second)
			if err == nil {
				t.mu.Lock()
				t.sock = c
				t.mu.Unlock()
			}
			return c, err
		},
	})
	if err != nil {
		return nil, err
	}
	t.Connection = conn
	return t, nil
}

// queues declares a fresh queue and its dead-letter queue on conn,
// deleted at cleanup, and returns their names.
func queues(tb testing.TB, conn *amqp.Connection) (queue, dead string) {
	tb.Helper()
	return queuesAt(tb, conn, testURL(tb))
}

// queuesAt is queues on conn to the RabbitMQ at url, where cleanup deletes
// them.
func queuesAt(tb testing.TB, conn *amqp.Connection, url string) (queue, dead string) {
	tb.Helper()
	queue = randName("idem-test-")
	dead = queue + ".dead"
	ch, err := conn.Channel()
	if err != nil {
		tb.Fatal(err)
	}
	defer ch.Close()
	for _, q := range []string{queue, dead} {
		if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			tb.Fatalf("declare %s: %v", q, err)
		}
	}
	tb.Cleanup(func() {
		c, err := amqp.Dial(url)
		if err != nil {
			return
		}
		defer c.Close()
		if ch, err := c.Channel(); err == nil {
			_, _ = ch.QueueDelete(queue, false, false, false)
			_, _ = ch.QueueDelete(dead, false, false, false)
		}
	})
	return queue, dead
}

// queueDepth returns the number of ready messages in q.
func queueDepth(tb testing.TB, conn *amqp.Connection, q string) int {
	tb.Helper()
	ch, err := conn.Channel()
	if err != nil {
		tb.Fatal(err)
	}
	defer ch.Close()
	st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return st.Messages
}

// rawPublish publishes msg to queue with confirms, bypassing the Producer
// (to publish without a message ID).
func rawPublish(ctx context.Context, conn *amqp.Connection, queue string, msg amqp.Publishing) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return err
	}
	msg.DeliveryMode = amqp.Persistent
	conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, msg)
	if err != nil {
		return err
	}
	_, err = conf.WaitContext(ctx)
	return err
}

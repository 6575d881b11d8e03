package natstest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"github.com/idem-go/idem/internal/testenv"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemnats"
	"github.com/idem-go/idem/store/idemsql"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	_ "modernc.org/sqlite" // the side-effect database of the store tests
)

// runConsumer starts c.Run and registers a cleanup that stops it and
// checks that Run returned nil.
func runConsumer(t *testing.T, c *idemnats.Consumer) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = c.Stop(ctx)
		select {
		case <-done:
		case <-ctx.Done():
			t.Errorf("Run did not return within 30s of Stop")
		}
	})
	return done
}

// newSQLiteStore opens a SQLite database named name in a temporary
// directory (closed at cleanup, at most 4 connections) and a migrated
// idem store on it.
func newSQLiteStore(t *testing.T, name string) (*sql.DB, *idemsql.Store) {
	t.Helper()
	db, err := sql.Open("sqlite", idemsql.SQLiteDSN(filepath.Join(t.TempDir(), name)))
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(4)
	t.Cleanup(func() { db.Close() })
	store, err := idemsql.New(db, idemsql.SQLite, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return db, store
}

// sqliteTx is a transactional idem consumer on a fresh SQLite database
// with an effects table written in the claim's transaction.
type sqliteTx struct {
	db   *sql.DB
	proc idem.Processor
}

func newSQLiteTx(t *testing.T) *sqliteTx {
	t.Helper()
	ctx := context.Background()
	db, store := newSQLiteStore(t, "effects.db")
	if _, err := db.ExecContext(ctx, `CREATE TABLE effects (seq INTEGER PRIMARY KEY AUTOINCREMENT, message_id TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	c, err := idem.NewConsumer[*sql.Tx](store, idem.Config{Name: "review", PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &sqliteTx{db: db, proc: idem.Bind(c, func(ctx context.Context, tx *sql.Tx, msg idem.Message) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO effects (message_id) VALUES (?)`, msg.ID)
		return err
	})}
}

// effects returns the number of rows and of distinct message IDs.
func (s *sqliteTx) effects(t *testing.T) (rows, distinct int) {
	t.Helper()
	if err := s.db.QueryRow(`SELECT COUNT(*), COUNT(DISTINCT message_id) FROM effects`).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	return rows, distinct
}

// The producer returns the ID the consumers will see: NATS trims the
// spaces around a header value, so an ID with leading or trailing spaces
// cannot be carried byte for byte and must be refused, not published as
// another ID (" a " would collide with "a").
func TestReviewProducerIDWithSurroundingSpaces(t *testing.T) {
	t.Parallel()
	conn := inProcess(t)
	_, js := newJS(t, conn)
	s := newStreams(t, js, time.Minute)
	ctx := context.Background()
	for i, id := range []string{" a", "a ", " a b "} {
		got, err := idemnats.NewProducer(js).Publish(ctx, s.subject, []byte("x"), idemnats.WithMessageID(id))
		if err != nil {
			if !errors.Is(err, idem.ErrInvalidMessageID) {
				t.Errorf("Publish(%q) = %v, want nil or an error matching ErrInvalidMessageID", id, err)
			}
			continue
		}
		m, err := s.stream.GetLastMsgForSubject(ctx, s.subject)
		if err != nil {
			t.Fatal(err)
		}
		if wire := m.Header.Get(jetstream.MsgIDHeader); wire != got {
			t.Errorf("case %d: Publish returned ID %q but the stored message carries %q", i, got, wire)
		}
	}
}

// A message with two different values of its ID header has no single
// identity: it is dead-lettered as an invalid ID rather than processed
// under whichever value comes first.
func TestReviewTwoIDHeaderValues(t *testing.T) {
	t.Parallel()
	conn := inProcess(t)
	var seen atomic.Value
	e := newMappingEnv(t, conn, idemnats.Config{IDHeader: "Event-Id"}, func(_ int, msg idem.Message) (idem.Outcome, error) {
		seen.Store(msg.ID)
		if err := idem.ValidateMessageID(msg.ID, 0); err != nil {
			return idem.Outcome{Status: idem.Rejected, MessageID: msg.ID, Err: err}, err
		}
		return idem.Outcome{Status: idem.Processed, MessageID: msg.ID}, nil
	})
	msg := nats.NewMsg(e.s.subject)
	msg.Data = []byte("two")
	msg.Header["Event-Id"] = []string{"order-1", "order-2"}
	if _, err := e.js.PublishMsg(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
	e.settled()
	dls, err := e.s.deadLetters(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 1 {
		t.Fatalf("%d dead letters, want 1 (the Processor saw ID %q)", len(dls), seen.Load())
	}
	if h := dls[0].Header; h.Get(idem.HeaderDeadLetterStatus) != "Rejected" || h.Get(idem.HeaderDeadLetterReason) != idem.ReasonInvalidMessageID || !strings.Contains(h.Get(idem.HeaderDeadLetterError), idem.ErrInvalidMessageID.Error()) {
		t.Errorf("dead letter headers %v", h)
	}
}

// A JetStream consumer with MaxDeliver drops a message after its last
// delivery without telling anyone. The adapter knows the delivery count,
// so a last delivery that is not acknowledged goes to the dead letter
// instead of being Nak'ed into oblivion.
func TestReviewMaxDeliverDeadLetters(t *testing.T) {
	t.Parallel()
	conn := inProcess(t)
	_, js := newJS(t, conn)
	s := newStreams(t, js, time.Minute)
	ctx := context.Background()
	cons, err := s.stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: "md", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 20 * time.Second, MaxDeliver: 3,
	})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	c, err := idemnats.NewConsumer(js, cons, idemnats.Config{
		Processor: idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
			calls.Add(1)
			err := errors.New("downstream unavailable")
			return idem.Outcome{Status: idem.Failed, MessageID: msg.ID, Err: err}, err
		}),
		DeadLetter: s.dlSubject, RetryDelay: 100 * time.Millisecond, Logger: testLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	runConsumer(t, c)
	if _, err := idemnats.NewProducer(js).Publish(ctx, s.subject, []byte("doomed"), idemnats.WithMessageID("m-1")); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "the message was not dead-lettered after MaxDeliver deliveries", func() bool {
		dls, err := s.deadLetters(ctx)
		return err == nil && len(dls) == 1
	}, nil)
	dls, _ := s.deadLetters(ctx)
	if h := dls[0].Header; h.Get(idem.HeaderOriginalMessageID) != "m-1" || h.Get(idem.HeaderDeadLetterReason) != idem.ReasonTooManyDeliveries || !strings.Contains(h.Get(idem.HeaderDeadLetterError), "downstream unavailable") {
		t.Errorf("dead letter headers %v", h)
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("Processor called %d times, want MaxDeliver (3)", n)
	}
}

// A dead-letter subject the consumer itself receives would feed every
// dead letter back to it: a message without an ID is dead-lettered, comes
// back without an ID, and is dead-lettered again, for ever. Run refuses
// such a configuration.
func TestReviewDeadLetterLoop(t *testing.T) {
	t.Parallel()
	conn := inProcess(t)
	_, js := newJS(t, conn)
	ctx := context.Background()
	u := unique()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "LOOP_" + u, Subjects: []string{"loop." + u + ".>"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), "LOOP_"+u) })
	for _, filter := range []string{"", "loop." + u + ".*"} {
		cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
			Durable: "loop" + fmt.Sprint(len(filter)), AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: filter,
		})
		if err != nil {
			t.Fatal(err)
		}
		c, err := idemnats.NewConsumer(js, cons, idemnats.Config{Processor: okProcessor, DeadLetter: "loop." + u + ".dead", Logger: testLogger()})
		if err != nil {
			if !errors.Is(err, idem.ErrInvalidConfig) {
				t.Errorf("filter %q: NewConsumer = %v, want nil or ErrInvalidConfig", filter, err)
			}
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = c.Run(rctx)
		cancel()
		if !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("filter %q: Run = %v, want an error matching idem.ErrInvalidConfig (the consumer receives its own dead letters)", filter, err)
		}
	}
	// A filter that leaves the dead-letter subject out is fine.
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: "ok", AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: "loop." + u + ".work",
	})
	if err != nil {
		t.Fatal(err)
	}
	c, err := idemnats.NewConsumer(js, cons, idemnats.Config{Processor: okProcessor, DeadLetter: "loop." + u + ".dead", Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	done := runConsumer(t, c)
	select {
	case err := <-done:
		t.Fatalf("Run with a filter excluding the dead letter returned %v", err)
	case <-time.After(500 * time.Millisecond):
	}
}

// Deleting the JetStream consumer under a running Consumer ends Run with
// an error instead of leaving it waiting for ever.
func TestReviewConsumerDeleted(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		end  func(t *testing.T, nc *nats.Conn, s *testStreams)
		want error
	}{
		{"consumer deleted", func(t *testing.T, _ *nats.Conn, s *testStreams) {
			if err := s.stream.DeleteConsumer(context.Background(), "gone"); err != nil {
				t.Fatal(err)
			}
		}, jetstream.ErrConsumerDeleted},
		{"connection closed", func(_ *testing.T, nc *nats.Conn, _ *testStreams) { nc.Close() }, nats.ErrConnectionClosed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			conn := inProcess(t)
			_, js := newJS(t, conn)
			s := newStreams(t, js, time.Minute)
			ctx := context.Background()
			if _, err := s.stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "gone", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
				t.Fatal(err)
			}
			// The Consumer has a connection of its own, the one closed.
			nc, cjs := newJS(t, conn)
			cons, err := cjs.Consumer(ctx, s.name, "gone")
			if err != nil {
				t.Fatal(err)
			}
			var calls atomic.Int32
			c, err := idemnats.NewConsumer(cjs, cons, idemnats.Config{
				Processor: idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
					calls.Add(1)
					return idem.Outcome{Status: idem.Processed, MessageID: msg.ID}, nil
				}),
				DeadLetter: s.dlSubject, Logger: testLogger(),
			})
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx) }()
			if _, err := idemnats.NewProducer(js).Publish(ctx, s.subject, []byte("one")); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, 30*time.Second, "first message not processed", func() bool { return calls.Load() == 1 }, nil)
			tc.end(t, nc, s)
			select {
			case err := <-done:
				if !errors.Is(err, tc.want) {
					t.Errorf("Run returned %v, want an error matching %v", err, tc.want)
				}
			case <-time.After(60 * time.Second):
				_ = c.Stop(ctx)
				t.Fatalf("Run still running 60s after: %s", tc.name)
			}
		})
	}
}

// How the Consumer pulls, each case processing every message once:
//   - the server's limits below the Consumer's: fewer ack-pending slots
//     than handlers, a MaxRequestBatch below MaxMessages or a
//     MaxRequestExpires below the pull request's 30s (a pull request then
//     asks for no more, and waits no longer, than the server takes; it
//     refuses a request above either);
//   - one message at a time: once each is settled, a pull request waits at
//     the server for the next, so consuming never pauses until a missing
//     heartbeat renews the pull.
func TestReviewPullRequests(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                     string
		cfg                      jetstream.ConsumerConfig
		concurrency, maxMessages int
		oneByOne                 bool
	}{
		{"max ack pending below concurrency", jetstream.ConsumerConfig{MaxAckPending: 1}, 4, 8, false},
		{"max request batch below max messages", jetstream.ConsumerConfig{MaxRequestBatch: 2}, 4, 8, false},
		{"max request expires below the pull's", jetstream.ConsumerConfig{MaxRequestExpires: 2 * time.Second}, 4, 8, false},
		{"a request waits while idle", jetstream.ConsumerConfig{}, 1, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.cfg.Durable = "pulls"
			js, s, cons := inProcessConsumer(t, tc.cfg)
			ctx := context.Background()
			st := newSQLiteTx(t)
			ended := &endedPulls{}
			c, err := idemnats.NewConsumer(js, cons, idemnats.Config{Processor: st.proc, Concurrency: tc.concurrency, MaxMessages: tc.maxMessages, DeadLetter: s.dlSubject, Logger: slog.New(ended)})
			if err != nil {
				t.Fatal(err)
			}
			runConsumer(t, c)
			const n = 30
			for i := range n {
				if _, err := idemnats.NewProducer(js).Publish(ctx, s.subject, []byte("p"), idemnats.WithMessageID(fmt.Sprintf("m-%d", i))); err != nil {
					t.Fatal(err)
				}
				if !tc.oneByOne {
					continue
				}
				testenv.Eventually(t, 30*time.Second, fmt.Sprintf("message %d not processed", i), func() bool { r, _ := st.effects(t); return r == i+1 }, nil)
				// A lost pull request would be replaced after two missed
				// heartbeats (2s) and logged: counted below.
				testenv.Eventually(t, 5*time.Second, fmt.Sprintf("no pull request waiting after message %d", i), func() bool {
					info, err := cons.Info(ctx)
					return err == nil && info.NumWaiting == 1 && info.NumAckPending == 0
				}, nil)
			}
			testenv.Eventually(t, 60*time.Second, "not every message was processed", func() bool { r, _ := st.effects(t); return r >= n }, nil)
			if r, d := st.effects(t); r != n || d != n {
				t.Errorf("%d effects for %d distinct IDs, want %d", r, d, n)
			}
			if e := ended.count.Load(); e != 0 {
				t.Errorf("%d pull requests ended in error (lost, refused), want 0", e)
			}
		})
	}
}

// endedPulls is a slog.Handler that counts the Consumer's "pull request
// ended" warnings (a pull request lost without an answer, refused by the
// server) and drops every record.
type endedPulls struct{ count atomic.Int64 }

func (h *endedPulls) Enabled(context.Context, slog.Level) bool { return true }

func (h *endedPulls) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "idemnats: pull request ended" {
		h.count.Add(1)
	}
	return nil
}

func (h *endedPulls) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *endedPulls) WithGroup(string) slog.Handler      { return h }

// A stopped Consumer leaves no pull request behind to take the next
// messages: published after Stop, they go to the next member at once, not
// after the ack wait (a minute).
func TestReviewStopLeavesNoPullRequest(t *testing.T) {
	t.Parallel()
	js, s, cons := inProcessConsumer(t, jetstream.ConsumerConfig{Durable: "stopped", AckWait: time.Minute})
	ctx := context.Background()
	st := newSQLiteTx(t)
	member := func() *idemnats.Consumer {
		c, err := idemnats.NewConsumer(js, cons, idemnats.Config{Processor: st.proc, Concurrency: 2, DeadLetter: s.dlSubject, Logger: testLogger()})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	first := member()
	done := make(chan error, 1)
	go func() { done <- first.Run(ctx) }()
	t.Cleanup(func() { _ = first.Stop(ctx) })
	testenv.Eventually(t, 10*time.Second, "no pull request waiting", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumWaiting == 1
	}, nil)
	if err := first.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Run after Stop: %v", err)
	}
	const n = 5
	for i := range n {
		if _, err := idemnats.NewProducer(js).Publish(ctx, s.subject, []byte("p"), idemnats.WithMessageID(fmt.Sprintf("m-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	runConsumer(t, member())
	testenv.Eventually(t, 20*time.Second, "messages published after Stop not processed", func() bool { r, _ := st.effects(t); return r >= n }, nil)
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r, d := st.effects(t); r != n || d != n || info.NumRedelivered != 0 {
		t.Errorf("%d effects for %d distinct IDs, %d redelivered; want %d, %d, 0", r, d, info.NumRedelivered, n, n)
	}
}

// NakWithDelay longer than the consumer's AckWait: JetStream waits for the
// delay, not the ack wait.
func TestReviewRetryAfterLongerThanAckWait(t *testing.T) {
	t.Parallel()
	js, s, cons := inProcessConsumer(t, jetstream.ConsumerConfig{Durable: "short", AckWait: time.Second})
	ctx := context.Background()
	const retryAfter = 3 * time.Second
	var mu sync.Mutex
	var times []time.Time
	c, err := idemnats.NewConsumer(js, cons, idemnats.Config{
		Processor: idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
			mu.Lock()
			times = append(times, time.Now())
			n := len(times)
			mu.Unlock()
			if n == 1 {
				return idem.Outcome{Status: idem.InProgress, MessageID: msg.ID, Err: idem.ErrInProgress, RetryAfter: retryAfter}, idem.ErrInProgress
			}
			return idem.Outcome{Status: idem.Duplicate, MessageID: msg.ID}, nil
		}),
		DeadLetter: s.dlSubject, Logger: testLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	runConsumer(t, c)
	if _, err := idemnats.NewProducer(js).Publish(ctx, s.subject, []byte("x")); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "not redelivered", func() bool { mu.Lock(); defer mu.Unlock(); return len(times) >= 2 }, nil)
	mu.Lock()
	d := times[1].Sub(times[0])
	mu.Unlock()
	if d < retryAfter-100*time.Millisecond {
		t.Errorf("redelivered after %v, want RetryAfter %v (the ack wait is 1s)", d, retryAfter)
	}
}

// The JetStream server is shut down and restarted on the same store
// directory and port while messages are being consumed: every message is
// processed, each effect exists once.
func TestReviewServerRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	opts := func(port int) *server.Options {
		return &server.Options{JetStream: true, StoreDir: dir, Host: "127.0.0.1", Port: port, NoSigs: true, NoLog: true, ServerName: "idemnats-restart"}
	}
	start := func(port int) *server.Server {
		srv, err := server.NewServer(opts(port))
		if err != nil {
			t.Fatal(err)
		}
		srv.Start()
		if !srv.ReadyForConnections(30 * time.Second) {
			t.Fatal("nats-server not ready")
		}
		return srv
	}
	srv := start(-1)
	addr := srv.ClientURL()
	var cur atomic.Pointer[server.Server]
	cur.Store(srv)
	t.Cleanup(func() { s := cur.Load(); s.Shutdown(); s.WaitForShutdown() })
	// The client must not drop a delivery (a slow consumer, in NATS's
	// terms) when it pulls again after the reconnect: a dropped message
	// comes back only after AckWait.
	var dropped atomic.Int32
	countDrops := nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrSlowConsumer) {
			dropped.Add(1)
		}
	})
	_, js := newJS(t, reconnecting(addr, 50*time.Millisecond, countDrops))
	s := newStreams(t, js, time.Minute)
	ctx := context.Background()
	cons, err := s.stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "restart", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	st := newSQLiteTx(t)
	var calls atomic.Int32
	proc := idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
		calls.Add(1)
		time.Sleep(5 * time.Millisecond)
		return st.proc.Process(ctx, msg)
	})
	c, err := idemnats.NewConsumer(js, cons, idemnats.Config{Processor: proc, Concurrency: 4, DeadLetter: s.dlSubject, RetryDelay: 200 * time.Millisecond, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	done := runConsumer(t, c)
	const n = 200
	for i := range n {
		if _, err := idemnats.NewProducer(js).Publish(ctx, s.subject, []byte("p"), idemnats.WithMessageID(fmt.Sprintf("m-%03d", i))); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 60*time.Second, "consumption did not start", func() bool { return calls.Load() >= 20 }, nil)
	srv.Shutdown()
	srv.WaitForShutdown()
	p := mustPort(t, addr)
	srv2 := start(p)
	cur.Store(srv2)
	testenv.Eventually(t, 120*time.Second, "not every message processed after the restart", func() bool { r, _ := st.effects(t); return r >= n }, nil)
	select {
	case err := <-done:
		t.Fatalf("Run returned %v across the restart", err)
	default:
	}
	if r, d := st.effects(t); r != n || d != n {
		t.Errorf("%d effects for %d distinct IDs, want %d and %d", r, d, n, n)
	}
	if dls, _ := s.deadLetters(ctx); len(dls) != 0 {
		t.Errorf("%d dead letters, want 0", len(dls))
	}
	if n := dropped.Load(); n != 0 {
		t.Errorf("the client dropped deliveries %d times (slow consumer), want 0", n)
	}
}

func mustPort(t *testing.T, url string) int {
	t.Helper()
	var p int
	i := strings.LastIndexByte(url, ':')
	if _, err := fmt.Sscanf(url[i+1:], "%d", &p); err != nil {
		t.Fatalf("port of %q: %v", url, err)
	}
	return p
}

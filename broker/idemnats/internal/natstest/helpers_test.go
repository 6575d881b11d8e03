package natstest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"github.com/idem-go/idem/internal/testenv"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/broker/idemnats"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// connector opens connections to one NATS server.
type connector func(t testing.TB) *nats.Conn

// inProcess starts an in-process JetStream server (file storage in a
// temporary directory, no listener), shut down at cleanup.
func inProcess(t testing.TB) connector {
	t.Helper()
	srv, err := server.NewServer(&server.Options{
		JetStream: true, StoreDir: t.TempDir(),
		DontListen: true, NoSigs: true, NoLog: true, ServerName: "idemnats-test",
	})
	if err != nil {
		t.Fatalf("nats-server: %v", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		srv.Shutdown()
		t.Fatal("nats-server: not ready after 30s")
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return func(t testing.TB) *nats.Conn {
		t.Helper()
		nc, err := nats.Connect("", nats.InProcessServer(srv))
		if err != nil {
			t.Fatalf("connect in-process NATS: %v", err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
}

// external connects to the server at IDEM_TEST_NATS_URL (Debian's
// nats-server with JetStream, started by scripts/services), skipping the
// test when it is unset, or failing it under IDEM_TEST_REQUIRE_ALL=1.
func external(t testing.TB) connector {
	t.Helper()
	url := testenv.URL(t, testenv.NATSEnv, "nats://127.0.0.1:4222 (a JetStream-enabled server)")
	return func(t testing.TB) *nats.Conn {
		t.Helper()
		nc, err := nats.Connect(url, nats.Timeout(10*time.Second))
		if err != nil {
			t.Fatalf("connect %s: %v", url, err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
}

// reconnecting connects to the server at url, reconnecting without end
// (wait apart) whenever the server goes away: for tests that kill or
// restart it. opts are added to the connection's options.
func reconnecting(url string, wait time.Duration, opts ...nats.Option) connector {
	return func(t testing.TB) *nats.Conn {
		t.Helper()
		all := append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(wait), nats.ReconnectJitter(0, 0), nats.Timeout(10 * time.Second)}, opts...)
		nc, err := nats.Connect(url, all...)
		if err != nil {
			t.Fatalf("connect %s: %v", url, err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
}

// newJS returns a JetStream context on a new connection.
func newJS(t testing.TB, conn connector) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc := conn(t)
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(20*time.Second))
	if err != nil {
		t.Fatalf("jetstream.New: %v", err)
	}
	return nc, js
}

// unique returns a random name suffix, so that tests sharing a server do
// not collide.
func unique() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// testLogger is a logger for the adapter under test: silent unless
// IDEM_TEST_VERBOSE=1.
func testLogger() *slog.Logger {
	if os.Getenv("IDEM_TEST_VERBOSE") == "1" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// inProcessConsumer returns a JetStream client on the in-process server,
// fresh streams (a minute's dedupe window) and a durable pull consumer of
// cfg on the work stream, with explicit acks.
func inProcessConsumer(t *testing.T, cfg jetstream.ConsumerConfig) (jetstream.JetStream, *testStreams, jetstream.Consumer) {
	t.Helper()
	_, js := newJS(t, inProcess(t))
	s := newStreams(t, js, time.Minute)
	cfg.AckPolicy = jetstream.AckExplicitPolicy
	cons, err := s.stream.CreateOrUpdateConsumer(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return js, s, cons
}

// testStreams creates a work stream and a dead-letter stream, deleted at
// cleanup.
type testStreams struct {
	name, subject, dlName, dlSubject string
	stream, dl                       jetstream.Stream
}

func newStreams(t testing.TB, js jetstream.JetStream, dedupe time.Duration) *testStreams {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u := unique()
	s := &testStreams{
		name: "IDEMNATS_" + u, subject: "idemnats." + u + ".work",
		dlName: "IDEMNATS_DL_" + u, dlSubject: "idemnats." + u + ".dead",
	}
	var err error
	// A loaded machine occasionally makes the server fail to create a file
	// store (API error 500, "error creating store for stream"); that is the
	// server's internal error, which a client may retry.
	for try := 0; try < 3; try++ {
		s.stream, err = js.CreateStream(ctx, jetstream.StreamConfig{
			Name: s.name, Subjects: []string{s.subject}, Storage: jetstream.FileStorage,
			Duplicates: dedupe,
		})
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || apiErr.Code != 500 {
			break
		}
	}
	if err != nil {
		t.Fatalf("create stream: %v", err)
	}
	// The dead-letter stream has the same short duplicate window: a dead
	// letter repeated after it (a message redelivered after its Term) is
	// stored again, as in production after the default 2 minutes.
	s.dl, err = js.CreateStream(ctx, jetstream.StreamConfig{
		Name: s.dlName, Subjects: []string{s.dlSubject}, Storage: jetstream.FileStorage,
		Duplicates: dedupe,
	})
	if err != nil {
		t.Fatalf("create dead-letter stream: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, n := range []string{s.name, s.dlName} {
			if err := js.DeleteStream(ctx, n); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
				t.Logf("delete stream %s: %v", n, err)
			}
		}
	})
	return s
}

// deadLetters reads every message of the dead-letter stream by sequence,
// without consuming them.
func (s *testStreams) deadLetters(ctx context.Context) ([]*jetstream.RawStreamMsg, error) {
	info, err := s.dl.Info(ctx)
	if err != nil {
		return nil, err
	}
	var out []*jetstream.RawStreamMsg
	if info.State.Msgs == 0 {
		return nil, nil
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := s.dl.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

// natsBroker implements brokertest.Broker on one pair of streams and one
// durable pull consumer, with one NATS connection per member.
type natsBroker struct {
	t       *testing.T
	conn    connector
	js      jetstream.JetStream
	streams *testStreams
	dedupe  time.Duration
	durable string
	mu      sync.Mutex // serialises consumer updates
}

var (
	_ brokertest.Broker         = (*natsBroker)(nil)
	_ brokertest.BatchBroker    = (*natsBroker)(nil)
	_ brokertest.PublishDeduper = (*natsBroker)(nil)
	_ brokertest.PayloadLimiter = (*natsBroker)(nil)
)

// PayloadLimit implements brokertest.PayloadLimiter: NATS's max_payload
// (1 MiB by default) counts the headers too, and a dead letter adds its own.
func (b *natsBroker) PayloadLimit() int { return 1<<20 - 8<<10 }

// brokerDedupe is the test streams' duplicate window (work and dead
// letter): short, so that the suite's late duplicates reach the consumer
// and a dead letter repeated after it is stored again, and twice the ack
// wait (brokertest's 1s), so that a dead letter repeated by a redelivery
// while the first delivery was in flight (a loaded machine) is dropped, as
// the default 2-minute window drops it in production.
const brokerDedupe = 2 * time.Second

func newNATSBroker(t *testing.T, conn connector) *natsBroker {
	_, js := newJS(t, conn)
	return &natsBroker{t: t, conn: conn, js: js, streams: newStreams(t, js, brokerDedupe), dedupe: brokerDedupe, durable: "idem"}
}

func (b *natsBroker) DedupeWindow() time.Duration { return b.dedupe }

// Publish implements brokertest.Broker; a publish the server dropped as a
// repeat within its duplicate window returns brokertest.ErrDeduped.
func (b *natsBroker) Publish(ctx context.Context, id string, payload []byte) error {
	if id == "" {
		_, err := b.js.Publish(ctx, b.streams.subject, payload)
		return err
	}
	js := &dedupeSeen{JetStream: b.js}
	// The producer helper refuses IDs idem would reject, so an invalid ID
	// is published raw, as a foreign producer would.
	if idem.ValidateMessageID(id, 0) != nil {
		msg := nats.NewMsg(b.streams.subject)
		msg.Data = payload
		msg.Header.Set(jetstream.MsgIDHeader, id)
		_, err := js.PublishMsg(ctx, msg)
		return js.result(err)
	}
	_, err := idemnats.NewProducer(js).Publish(ctx, b.streams.subject, payload, idemnats.WithMessageID(id))
	return js.result(err)
}

// dedupeSeen is a JetStream that remembers whether the server answered a
// publish as a duplicate (PubAck.Duplicate: it dropped the message).
type dedupeSeen struct {
	jetstream.JetStream
	dup bool
}

func (d *dedupeSeen) PublishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	ack, err := d.JetStream.PublishMsg(ctx, msg, opts...)
	if err == nil && ack != nil && ack.Duplicate {
		d.dup = true
	}
	return ack, err
}

// result is err, or brokertest.ErrDeduped when the server dropped the
// publish.
func (d *dedupeSeen) result(err error) error {
	if err == nil && d.dup {
		return brokertest.ErrDeduped
	}
	return err
}

func (b *natsBroker) DeadLetters(ctx context.Context) ([]brokertest.DeadLetter, error) {
	msgs, err := b.streams.deadLetters(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]brokertest.DeadLetter, len(msgs))
	for i, m := range msgs {
		out[i] = brokertest.DeadLetter{ID: m.Header.Get(idem.HeaderOriginalMessageID), Payload: m.Data,
			Reason: m.Header.Get(idem.HeaderDeadLetterReason), Error: m.Header.Get(idem.HeaderDeadLetterError)}
	}
	return out, nil
}

// consumer creates or updates the durable consumer with the given ack wait
// and returns it seen through js.
func (b *natsBroker) consumer(ctx context.Context, js jetstream.JetStream, ackWait time.Duration) (jetstream.Consumer, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ackWait <= 0 {
		ackWait = 30 * time.Second
	}
	_, err := b.streams.stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: b.durable, AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait,
		MaxAckPending: 1000,
	})
	if err != nil {
		return nil, err
	}
	return js.Consumer(ctx, b.streams.name, b.durable)
}

// newConsumer returns a Consumer of the durable consumer on a connection of
// its own, closed at cleanup.
func (b *natsBroker) newConsumer(ctx context.Context, p idem.Processor, opts brokertest.StartOptions) (*nats.Conn, *idemnats.Consumer, error) {
	return b.newConsumerOf(ctx, p, nil, opts)
}

// newConsumerOf is newConsumer with p or, in batch mode, bp (batches of at
// most opts.BatchSize: the messages held).
func (b *natsBroker) newConsumerOf(ctx context.Context, p idem.Processor, bp idem.BatchProcessor, opts brokertest.StartOptions) (*nats.Conn, *idemnats.Consumer, error) {
	nc, js := newJS(b.t, b.conn)
	cons, err := b.consumer(ctx, js, opts.Redelivery)
	if err != nil {
		return nil, nil, err
	}
	maxMessages := opts.Prefetch
	if bp != nil {
		maxMessages = opts.BatchSize
	}
	c, err := idemnats.NewConsumer(js, cons, idemnats.Config{
		Processor: p, BatchProcessor: bp, Concurrency: opts.Concurrency, MaxMessages: maxMessages, HandlerTimeout: opts.HandlerTimeout,
		DeadLetter: b.streams.dlSubject, RetryDelay: opts.Redelivery / 5,
		// No progress reports: the suite's ack-timeout case wants the
		// broker to redeliver a message still in flight.
		ProgressInterval: -1,
		Logger:           testLogger(),
	})
	return nc, c, err
}

// NewConsumer implements brokertest.Broker.
func (b *natsBroker) NewConsumer(p idem.Processor, opts brokertest.StartOptions) (brokertest.Runner, error) {
	_, c, err := b.newConsumer(context.Background(), p, opts)
	return c, err
}

func (b *natsBroker) Start(ctx context.Context, p idem.Processor, opts brokertest.StartOptions) (brokertest.Member, error) {
	nc, c, err := b.newConsumer(ctx, p, opts)
	if err != nil {
		return nil, err
	}
	return startMember(nc, c), nil
}

// StartBatch implements brokertest.BatchBroker: the Consumer in batch mode
// (Config.BatchProcessor), holding at most opts.BatchSize messages, so
// that no batch is larger.
func (b *natsBroker) StartBatch(ctx context.Context, p idem.BatchProcessor, opts brokertest.StartOptions) (brokertest.Member, error) {
	nc, c, err := b.newConsumerOf(ctx, nil, p, opts)
	if err != nil {
		return nil, err
	}
	return startMember(nc, c), nil
}

// startMember runs c (on connection nc) as a member.
func startMember(nc *nats.Conn, c *idemnats.Consumer) *natsMember {
	m := &natsMember{c: c, nc: nc, done: make(chan error, 1)}
	go func() { m.done <- c.Run(context.Background()) }()
	return m
}

type natsMember struct {
	c    *idemnats.Consumer
	nc   *nats.Conn
	done chan error
}

func (m *natsMember) Stop(ctx context.Context) error {
	if err := m.c.Stop(ctx); err != nil {
		return err
	}
	select {
	case err := <-m.done:
		m.nc.Close()
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Crash closes the member's connection: no ack or nak of it reaches the
// server any more, and JetStream redelivers after the ack wait.
func (m *natsMember) Crash() { m.nc.Close() }

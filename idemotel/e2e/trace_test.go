package e2e

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemamqp"
	"github.com/idem-go/idem/broker/idemkafka"
	"github.com/idem-go/idem/broker/idemnats"
	"github.com/idem-go/idem/broker/idemredisstream"
	"github.com/idem-go/idem/idemotel"
	"github.com/idem-go/idem/internal/testenv"
)

// bundle is one test's tracing: an in-memory exporter behind a
// synchronous tracer provider, the Observer on it, and a consumer whose
// handler records its effect as a span and reports the message ID.
type bundle struct {
	exp      *tracetest.InMemoryExporter
	tp       *sdktrace.TracerProvider
	tracer   trace.Tracer
	consumer *idem.Consumer[*idem.MemoryTx]
	proc     idem.Processor
	done     chan string
}

func setup(t *testing.T) *bundle {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	obs, err := idemotel.NewObserver(idemotel.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{exp: exp, tp: tp, tracer: tp.Tracer("e2e"), done: make(chan string, 4)}
	b.consumer, err = idem.NewConsumer(idem.NewMemoryStore(nil), idem.Config{Name: "payments", Hooks: []idem.Hook{obs}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.consumer.Close() })
	b.proc = idem.Bind(b.consumer, func(ctx context.Context, tx *idem.MemoryTx, m idem.Message) error {
		_, span := b.tracer.Start(ctx, "charge")
		span.End()
		tx.OnCommit(func() { b.done <- m.ID })
		return nil
	})
	return b
}

// publish runs pub inside a producer span and returns that span's context.
func (b *bundle) publish(t *testing.T, pub func(ctx context.Context) error) trace.SpanContext {
	t.Helper()
	ctx, span := b.tracer.Start(context.Background(), "publish", trace.WithSpanKind(trace.SpanKindProducer))
	defer span.End()
	if err := pub(ctx); err != nil {
		t.Fatalf("publish: %v", err)
	}
	return span.SpanContext()
}

// check waits for the message and asserts one trace from the publish span
// to the handler's effect: the process span is a child of the publish
// span and links to it, carries the adapter's messaging attributes, and
// is the parent of the handler's span.
func (b *bundle) check(t *testing.T, id string, pub trace.SpanContext, system, dest, group string) {
	t.Helper()
	select {
	case got := <-b.done:
		if got != id {
			t.Fatalf("processed %q, want %q", got, id)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("message not processed within 60s")
	}
	var process, charge *tracetest.SpanStub
	testenv.Eventually(t, 10*time.Second, "the process span ends", func() bool {
		process, charge = nil, nil
		for _, s := range b.exp.GetSpans() {
			switch s.Name {
			case "process " + dest:
				process = &s
			case "charge":
				charge = &s
			}
		}
		return process != nil && charge != nil
	}, func() string { return "spans: " + names(b.exp.GetSpans()) })
	if process.SpanKind != trace.SpanKindConsumer {
		t.Errorf("process span kind %v, want consumer", process.SpanKind)
	}
	if process.SpanContext.TraceID() != pub.TraceID() || process.Parent.SpanID() != pub.SpanID() {
		t.Errorf("process span in trace %s under %s, want a child of the publish span %s/%s",
			process.SpanContext.TraceID(), process.Parent.SpanID(), pub.TraceID(), pub.SpanID())
	}
	if len(process.Links) != 1 || process.Links[0].SpanContext.SpanID() != pub.SpanID() {
		t.Errorf("process span links %+v, want one to the publish span", process.Links)
	}
	if charge.Parent.SpanID() != process.SpanContext.SpanID() || charge.SpanContext.TraceID() != pub.TraceID() {
		t.Errorf("the handler's span is not a child of the process span in the publish's trace")
	}
	want := map[attribute.Key]string{"messaging.system": system, "messaging.destination.name": dest,
		"messaging.message.id": id, "idem.consumer": "payments", "messaging.operation.name": "process"}
	if group != "" {
		want["messaging.consumer.group.name"] = group
	}
	got := map[attribute.Key]string{}
	for _, kv := range process.Attributes {
		got[kv.Key] = kv.Value.Emit()
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("process span %s = %q, want %q", k, got[k], v)
		}
	}
	if group == "" {
		if v, ok := got["messaging.consumer.group.name"]; ok {
			t.Errorf("process span has messaging.consumer.group.name %q on a broker without groups", v)
		}
	}
}

func names(spans tracetest.SpanStubs) string {
	s := ""
	for _, sp := range spans {
		s += sp.Name + "; "
	}
	return s
}

func suffix() string { return strconv.FormatInt(time.Now().UnixNano(), 36) }

func TestTraceNATS(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	js := startJetStream(t)
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.*"}})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "billing", FilterSubject: "orders.created", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	c, err := idemnats.NewConsumer(js, cons, idemnats.Config{Processor: b.proc, DeadLetter: "orders.dead"})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Run(ctx) }()
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	p := idemnats.NewProducer(js, idemnats.WithHeaderInjector(idemotel.InjectTraceContext))
	pub := b.publish(t, func(ctx context.Context) error {
		_, err := p.Publish(ctx, "orders.created", []byte(`{"cents":100}`), idemnats.WithMessageID("order-1"))
		return err
	})
	b.check(t, "order-1", pub, "nats", "orders.created", "billing")
}

func TestTraceKafka(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "payments", "payments-dead"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	prod, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prod.Close)
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumerGroup("ledger"),
		kgo.ConsumeTopics("payments"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, idemkafka.ClientOpts()...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	c, err := idemkafka.NewConsumer(cl, idemkafka.Config{Processor: b.proc, DeadLetter: "payments-dead"})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Run(ctx) }()
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	p := idemkafka.NewProducer(prod, idemkafka.ProducerConfig{InjectHeaders: idemotel.InjectTraceContext})
	pub := b.publish(t, func(ctx context.Context) error {
		_, err := p.Publish(ctx, "payments", []byte(`{"cents":100}`), idemkafka.WithMessageID("pay-1"))
		return err
	})
	b.check(t, "pay-1", pub, "kafka", "payments", "ledger")
}

func TestTraceRabbitMQ(t *testing.T) {
	t.Parallel()
	url := testenv.URL(t, testenv.AMQPEnv, "amqp://guest:guest@127.0.0.1:5672/")
	b := setup(t)
	ctx := t.Context()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	queue := "idem-e2e-" + suffix()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{queue, queue + ".dead"} {
		if _, err := ch.QueueDeclare(q, false, true, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	c, err := idemamqp.NewConsumer(conn, idemamqp.Config{Queue: queue, DeadLetter: queue + ".dead", Processor: b.proc})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Run(ctx) }()
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	p := idemamqp.NewProducer(conn, idemamqp.ProducerConfig{InjectHeaders: idemotel.InjectTraceContext})
	t.Cleanup(func() { _ = p.Close() })
	pub := b.publish(t, func(ctx context.Context) error {
		_, err := p.Publish(ctx, queue, []byte(`{"cents":100}`), idemamqp.WithMessageID("pay-1"))
		return err
	})
	b.check(t, "pay-1", pub, "rabbitmq", queue, "")
}

func TestTraceRedisStreams(t *testing.T) {
	t.Parallel()
	url := testenv.URL(t, testenv.RedisEnv, "redis://127.0.0.1:6379/0")
	b := setup(t)
	ctx := t.Context()
	opts, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	stream := "idem-e2e:{" + suffix() + "}"
	t.Cleanup(func() { rdb.Del(context.Background(), stream, stream+":dead") })
	c, err := idemredisstream.NewConsumer(rdb, idemredisstream.Config{Stream: stream, Group: "ledger", Consumer: "w1",
		DeadLetter: stream + ":dead", Processor: b.proc})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Run(ctx) }()
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	p := idemredisstream.NewProducer(rdb, idemredisstream.ProducerConfig{InjectHeaders: idemotel.InjectTraceContext})
	pub := b.publish(t, func(ctx context.Context) error {
		_, err := p.Publish(ctx, stream, []byte(`{"cents":100}`), idemredisstream.WithMessageID("pay-1"))
		return err
	})
	b.check(t, "pay-1", pub, "redis", stream, "ledger")
}

// TestTraceThroughOutbox: a message emitted through the outbox carries the
// trace of the span that processed the incoming message (Config.OutboxHeaders
// = idemotel.InjectTraceContext stores it in the row), so the downstream
// consumer's process span, reached through the relay and a real NATS
// JetStream server, is a child of the upstream process span: one trace
// from the first message to the downstream effect.
func TestTraceThroughOutbox(t *testing.T) {
	t.Parallel()
	b := setup(t) // the downstream consumer ("payments" on receipts.requested)
	ctx := t.Context()
	js := startJetStream(t)
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "RECEIPTS", Subjects: []string{"receipts.*"}})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "mailer", FilterSubject: "receipts.requested", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	c, err := idemnats.NewConsumer(js, cons, idemnats.Config{Processor: b.proc, DeadLetter: "receipts.dead"})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Run(ctx) }()
	t.Cleanup(func() { _ = c.Stop(context.Background()) })

	// Upstream: a consumer on the same tracer that emits one message per
	// payment, and a relay that publishes with no span of its own.
	obs, err := idemotel.NewObserver(idemotel.WithTracerProvider(b.tp))
	if err != nil {
		t.Fatal(err)
	}
	store := idem.NewMemoryStore(nil)
	up, err := idem.NewConsumer(store, idem.Config{Name: "charges", Hooks: []idem.Hook{obs}, OutboxHeaders: idemotel.InjectTraceContext})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = up.Close() })
	var upstream trace.SpanContext
	out, err := up.Process(ctx, idem.Message{ID: "pay-1", Payload: []byte(`{"cents":100}`)}, func(ctx context.Context, _ *idem.MemoryTx, m idem.Message) error {
		upstream = trace.SpanContextFromContext(ctx)
		_, err := idem.Emit(ctx, idem.OutgoingMessage{Destination: "receipts.requested", Name: "receipt", Payload: []byte("receipt")})
		return err
	})
	if err != nil || out.Status != idem.Processed {
		t.Fatalf("upstream Process = %v, %v", out.Status, err)
	}
	if !upstream.IsValid() {
		t.Fatal("the upstream handler's context has no span")
	}
	relay, err := idem.NewRelay(idem.RelayConfig{Store: store, Publisher: idemnats.NewPublisher(js), Retention: -1})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := relay.RunOnce(context.Background()); err != nil || res.Sent != 1 {
		t.Fatalf("relay RunOnce = %+v, %v; want 1 sent", res, err)
	}
	b.check(t, idem.OutgoingID("charges", "pay-1", "receipt", 0), upstream, "nats", "receipts.requested", "mailer")
}

// startJetStream starts an in-process nats-server with JetStream for t and
// returns a JetStream client connected to it.
func startJetStream(t *testing.T) jetstream.JetStream {
	t.Helper()
	srv, err := server.NewServer(&server.Options{JetStream: true, StoreDir: t.TempDir(), DontListen: true, NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(30 * time.Second) {
		t.Fatal("nats-server not ready after 30s")
	}
	nc, err := nats.Connect("", nats.InProcessServer(srv))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return js
}

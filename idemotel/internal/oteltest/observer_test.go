package oteltest

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemotel"
	"github.com/idem-go/idem/internal/leakcheck"
)

func TestMain(m *testing.M) { os.Exit(leakcheck.Run(m)) }

type testBundle struct {
	reader *sdkmetric.ManualReader
	spans  *tracetest.InMemoryExporter
	tp     *sdktrace.TracerProvider
	obs    *idemotel.Observer
	store  *idem.MemoryStore
	clock  *clock
}

// clock is the memory store's clock in these tests: it starts five hours
// in the past and moves only when a test advances it.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	clk := &clock{t: time.Now().Add(-5 * time.Hour)}
	b := &testBundle{reader: sdkmetric.NewManualReader(), spans: tracetest.NewInMemoryExporter(), store: idem.NewMemoryStore(clk.Now), clock: clk}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(b.reader))
	b.tp = sdktrace.NewTracerProvider(sdktrace.WithSyncer(b.spans))
	t.Cleanup(func() {
		_ = mp.Shutdown(context.Background())
		_ = b.tp.Shutdown(context.Background())
	})
	var err error
	b.obs, err = idemotel.NewObserver(idemotel.WithMeterProvider(mp), idemotel.WithTracerProvider(b.tp), idemotel.WithMessagingSystem("kafka"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { checkConventions(t, b) })
	return b
}

func (b *testBundle) config(cfg idem.Config) idem.Config {
	cfg.PurgeInterval = -1
	cfg.Hooks = []idem.Hook{b.obs}
	return cfg
}

// consumer returns a transactional consumer on the bundle's store with
// cfg and the Observer (see config), closed when t ends.
func (b *testBundle) consumer(t *testing.T, cfg idem.Config) *idem.Consumer[*idem.MemoryTx] {
	t.Helper()
	c, err := idem.NewConsumer[*idem.MemoryTx](b.store, b.config(cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// collect returns the metrics recorded so far, by name.
func (b *testBundle) collect(t *testing.T) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := b.reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != idemotel.ScopeName {
			t.Errorf("scope %q, want %q", sm.Scope.Name, idemotel.ScopeName)
		}
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// matches reports whether set has every attribute of want (a "" value
// means the key must be absent).
func matches(set attribute.Set, want map[string]string) bool {
	for k, v := range want {
		got, ok := set.Value(attribute.Key(k))
		if v == "" {
			if ok {
				return false
			}
			continue
		}
		if !ok || got.Emit() != v {
			return false
		}
	}
	return true
}

// sum adds the int64 points of the sum metric name that match want.
func sum(t *testing.T, ms map[string]metricdata.Metrics, name string, want map[string]string) int64 {
	t.Helper()
	m, ok := ms[name]
	if !ok {
		return 0
	}
	s, ok := m.Data.(metricdata.Sum[int64])
	if !ok {
		t.Fatalf("%s is %T, want an int64 sum", name, m.Data)
	}
	var n int64
	for _, p := range s.DataPoints {
		if matches(p.Attributes, want) {
			n += p.Value
		}
	}
	return n
}

// histCount counts the recordings of histogram name that match want.
func histCount(t *testing.T, ms map[string]metricdata.Metrics, name string, want map[string]string) uint64 {
	t.Helper()
	h, ok := ms[name].Data.(metricdata.Histogram[float64])
	if !ok {
		t.Fatalf("%s is %T, want a float64 histogram", name, ms[name].Data)
	}
	var n uint64
	for _, p := range h.DataPoints {
		if matches(p.Attributes, want) {
			n += p.Count
		}
	}
	return n
}

func expect[T comparable](t *testing.T, what string, got, want T) {
	t.Helper()
	if got != want {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

func spanAttr(s tracetest.SpanStub, key string) string {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value.Emit()
		}
	}
	return ""
}

// A transactional consumer's deliveries and a batch become counters by
// status and reason, claim counters that return to zero active, process
// durations with the semantic-convention attributes, and spans the
// handler's spans nest in.
func TestTransactionalMetricsAndSpans(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.consumer(t, idem.Config{Name: "payments"})
	ctx := t.Context()
	var handlerSpan trace.SpanContext
	ok := func(ctx context.Context, _ *idem.MemoryTx, m idem.Message) error {
		if m.ID == "m1" {
			_, s := b.tp.Tracer("handler").Start(ctx, "charge")
			handlerSpan = s.SpanContext()
			s.End()
		}
		return nil
	}
	boom := func(context.Context, *idem.MemoryTx, idem.Message) error { return errors.New("boom") }
	p := []byte("p")
	_, _ = c.Process(ctx, idem.Message{ID: "m1", Payload: p}, ok)
	_, _ = c.Process(ctx, idem.Message{ID: "m1", Payload: p}, ok)
	_, _ = c.Process(ctx, idem.Message{ID: "m1", Payload: []byte("other")}, ok)
	_, _ = c.Process(ctx, idem.Message{ID: "m2", Payload: p}, boom)
	_, _ = c.Process(ctx, idem.Message{ID: "", Payload: p}, ok)
	_, _ = c.ProcessBatch(ctx, []idem.Message{{ID: "a", Payload: p}, {ID: "b", Payload: p}, {ID: "a", Payload: p}},
		func(context.Context, *idem.MemoryTx, []idem.Message) error { return nil })

	ms := b.collect(t)
	tx := map[string]string{"idem.consumer": "payments", "messaging.system": "kafka", "idem.mode": "transactional"}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range tx {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	expect(t, "processed", sum(t, ms, "idem.messages", with("idem.status", "processed", "idem.duplicate.reason", "")), 3)
	expect(t, "duplicates completed", sum(t, ms, "idem.messages", with("idem.status", "duplicate", "idem.duplicate.reason", "completed")), 2)
	expect(t, "mismatches", sum(t, ms, "idem.messages", with("idem.status", "fingerprint_mismatch", "idem.duplicate.reason", "fingerprint_mismatch")), 1)
	expect(t, "failed", sum(t, ms, "idem.messages", with("idem.status", "failed")), 1)
	expect(t, "rejected", sum(t, ms, "idem.messages", with("idem.status", "rejected")), 1)
	expect(t, "all messages", sum(t, ms, "idem.messages", nil), 8)
	expect(t, "claims", sum(t, ms, "idem.claims", tx), 4)
	expect(t, "active claims", sum(t, ms, "idem.claims.active", tx), 0)
	expect(t, "released claims", sum(t, ms, "idem.claims.released", tx), 1)
	expect(t, "process calls", histCount(t, ms, "messaging.process.duration", with("messaging.operation.name", "process")), 6)
	expect(t, "process calls with error.type handler", histCount(t, ms, "messaging.process.duration", with("error.type", "handler", "idem.status", "failed")), 1)
	expect(t, "duplicate process calls", histCount(t, ms, "messaging.process.duration", with("idem.status", "duplicate", "error.type", "")), 1)
	expect(t, "claim durations", histCount(t, ms, "idem.claim.duration", tx), 4) // one per claim: m1, m2, a, b
	for _, m := range ms {
		if m.Name == "idem.messages" {
			for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
				if _, ok := p.Attributes.Value("messaging.message.id"); ok {
					t.Error("a metric carries messaging.message.id")
				}
			}
		}
	}

	spans := b.spans.GetSpans()
	byID := map[string]tracetest.SpanStub{}
	var batch *tracetest.SpanStub
	for i, s := range spans {
		if s.Name != "process" {
			continue
		}
		if id := spanAttr(s, "messaging.message.id"); id != "" || spanAttr(s, "messaging.batch.message_count") == "" {
			byID[id+"/"+spanAttr(s, "idem.status")] = s
		} else {
			batch = &spans[i]
		}
	}
	m1, okSpan := byID["m1/processed"]
	if !okSpan {
		t.Fatalf("no processed span for m1 among %d spans", len(spans))
	}
	expect(t, "m1 span kind", m1.SpanKind, trace.SpanKindConsumer)
	for k, v := range map[string]string{"messaging.operation.name": "process", "messaging.operation.type": "process",
		"idem.consumer": "payments", "messaging.system": "kafka", "idem.mode": "transactional"} {
		expect(t, "m1 span "+k, spanAttr(m1, k), v)
	}
	expect(t, "handler span parent", handlerSpan.IsValid() && m1.SpanContext.SpanID() == findParent(spans, handlerSpan), true)
	if len(m1.Events) != 1 || m1.Events[0].Name != "idem.claim" {
		t.Errorf("m1 span events %v, want the claim", m1.Events)
	}
	dup := byID["m1/duplicate"]
	expect(t, "duplicate span reason", spanAttr(dup, "idem.duplicate.reason"), "completed")
	expect(t, "duplicate span status", dup.Status.Code, codes.Unset)
	failed := byID["m2/failed"]
	expect(t, "failed span status", failed.Status.Code, codes.Error)
	expect(t, "failed span error.type", spanAttr(failed, "error.type"), "handler")
	if batch == nil || spanAttr(*batch, "messaging.batch.message_count") != "3" || len(batch.Events) != 2 {
		t.Errorf("batch span %+v, want a message count of 3 and 2 claim events", batch)
	}
}

// findParent returns the parent span ID of the span sc among spans.
func findParent(spans tracetest.SpanStubs, sc trace.SpanContext) trace.SpanID {
	for _, s := range spans {
		if s.SpanContext.SpanID() == sc.SpanID() {
			return s.Parent.SpanID()
		}
	}
	return trace.SpanID{}
}

// Lease mode: a retry after a release counts a takeover and a released
// claim, renewals are counted, and a stale completion is a lost lease at
// "complete"; poison is its own status.
func TestLeaseMetrics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, err := idem.NewLeaseConsumer(b.store, b.config(idem.Config{Name: "mailer", Lease: 30 * time.Second, MaxAttempts: 2}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	short, err := idem.NewLeaseConsumer(b.store, b.config(idem.Config{Name: "mailer", Lease: 300 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	defer short.Close()
	ctx := t.Context()
	p := []byte("p")
	fail := func(context.Context, *idem.Attempt) (idem.Result, error) {
		return idem.Result{}, errors.New("smtp down")
	}
	done := func(context.Context, *idem.Attempt) (idem.Result, error) {
		return idem.Result{Body: []byte("sent")}, nil
	}
	_, _ = c.Process(ctx, idem.Message{ID: "m1", Payload: p}, fail) // released
	_, _ = c.Process(ctx, idem.Message{ID: "m1", Payload: p}, fail) // takeover, poison
	_, _ = c.Process(ctx, idem.Message{ID: "m1", Payload: p}, done) // poison record

	// A handler with a short lease runs until a renewal was counted.
	if _, err := short.Process(ctx, idem.Message{ID: "m3", Payload: p}, func(context.Context, *idem.Attempt) (idem.Result, error) {
		deadline := time.Now().Add(10 * time.Second)
		for sum(t, b.collect(t), "idem.lease.renewals", nil) == 0 {
			if time.Now().After(deadline) {
				return idem.Result{}, errors.New("no renewal counted within 10s")
			}
			time.Sleep(20 * time.Millisecond) // polling a metric, not ordering events
		}
		return idem.Result{}, nil
	}); err != nil {
		t.Fatal(err)
	}

	// A handler whose lease is expired under it while another attempt
	// completes the message: its own completion is stale.
	inside, release := make(chan struct{}), make(chan struct{})
	stale := make(chan idem.Outcome, 1)
	go func() {
		out, _ := c.Process(ctx, idem.Message{ID: "m2", Payload: p}, func(context.Context, *idem.Attempt) (idem.Result, error) {
			close(inside)
			<-release
			return idem.Result{}, nil
		})
		stale <- out
	}()
	<-inside
	b.clock.Advance(31 * time.Second) // m2's 30-second lease runs out
	if out, err := c.Process(ctx, idem.Message{ID: "m2", Payload: p}, done); out.Status != idem.Processed {
		t.Fatalf("takeover of m2: %v %v", out.Status, err)
	}
	close(release)
	if out := <-stale; out.Status != idem.Failed || !errors.Is(out.Err, idem.ErrLeaseLost) {
		t.Fatalf("stale attempt: %v %v", out.Status, out.Err)
	}

	ms := b.collect(t)
	lease := map[string]string{"idem.consumer": "mailer", "idem.mode": "lease"}
	expect(t, "poison", sum(t, ms, "idem.messages", map[string]string{"idem.status": "poison", "idem.duplicate.reason": ""}), 1)
	expect(t, "poison duplicates", sum(t, ms, "idem.messages", map[string]string{"idem.status": "poison", "idem.duplicate.reason": "poison"}), 1)
	expect(t, "processed", sum(t, ms, "idem.messages", map[string]string{"idem.status": "processed"}), 2)
	expect(t, "failed (stale)", sum(t, ms, "idem.messages", map[string]string{"idem.status": "failed"}), 2)
	expect(t, "claims", sum(t, ms, "idem.claims", lease), 5)
	expect(t, "active claims", sum(t, ms, "idem.claims.active", lease), 0)
	expect(t, "released claims", sum(t, ms, "idem.claims.released", lease), 1)
	expect(t, "takeovers", sum(t, ms, "idem.lease.takeovers", nil), 2)
	expect(t, "stale completions", sum(t, ms, "idem.lease.lost", map[string]string{"idem.store.operation": "complete"}), 1)
	if n := sum(t, ms, "idem.lease.renewals", map[string]string{"idem.consumer": "mailer"}); n < 1 {
		t.Errorf("renewals %d, want at least 1", n)
	}
	expect(t, "stale process calls", histCount(t, ms, "messaging.process.duration", map[string]string{"error.type": "lease_lost"}), 1)
}

// failingStore fails every Begin.
type failingStore struct{ *idem.MemoryStore }

func (failingStore) Begin(context.Context) (*idem.MemoryTx, error) {
	return nil, errors.New("connection refused")
}

func TestStoreErrorsAndPurge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bad, err := idem.NewConsumer[*idem.MemoryTx](failingStore{b.store}, b.config(idem.Config{Name: "bad"}))
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	_, _ = bad.Process(t.Context(), idem.Message{ID: "m", Payload: []byte("p")}, func(context.Context, *idem.MemoryTx, idem.Message) error { return nil })

	c, err := idem.NewConsumer[*idem.MemoryTx](b.store, b.config(idem.Config{Name: "good", RetentionWindow: time.Hour}))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b"} {
		if _, err := c.Process(t.Context(), idem.Message{ID: id, Payload: []byte("p")}, func(context.Context, *idem.MemoryTx, idem.Message) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	// "good" runs for three hours after a and b, then is down for two:
	// the horizon is three hours back, two hours of lag.
	_ = c.Close()
	mark := func(gap time.Duration) {
		if err := b.store.MarkRunning(t.Context(), &idemdriver.MarkRunningParams{Consumer: "good", MaxGap: gap}); err != nil {
			t.Fatal(err)
		}
	}
	mark(0)
	b.clock.Advance(3 * time.Hour)
	mark(4 * time.Hour)
	b.clock.Advance(2 * time.Hour)
	c, err = idem.NewConsumer[*idem.MemoryTx](b.store, b.config(idem.Config{Name: "good", RetentionWindow: time.Hour}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if res, err := c.Purge(t.Context()); err != nil || res.Deleted != 2 {
		t.Fatalf("Purge: %+v %v", res, err)
	}

	ms := b.collect(t)
	expect(t, "store errors at begin", sum(t, ms, "idem.store.errors", map[string]string{"idem.consumer": "bad", "idem.store.operation": "begin", "idem.mode": "transactional"}), 1)
	expect(t, "store errors of good", sum(t, ms, "idem.store.errors", map[string]string{"idem.consumer": "good"}), 0)
	expect(t, "error.type store", histCount(t, ms, "messaging.process.duration", map[string]string{"error.type": "store"}), 1)
	expect(t, "purge runs", sum(t, ms, "idem.purge.runs", map[string]string{"idem.consumer": "good", "idem.purge.result": "ok"}), 1)
	expect(t, "purge rows", sum(t, ms, "idem.purge.rows", map[string]string{"idem.consumer": "good"}), 2)
	expect(t, "purge durations", histCount(t, ms, "idem.purge.duration", map[string]string{"idem.purge.result": "ok"}), 1)
	g, ok := ms["idem.purge.lag"].Data.(metricdata.Gauge[float64])
	if !ok || len(g.DataPoints) != 1 {
		t.Fatalf("idem.purge.lag: %+v", ms["idem.purge.lag"].Data)
	}
	if lag := g.DataPoints[0].Value; lag < 7100 || lag > 7300 {
		t.Errorf("purge lag %vs, want about 7200 (the two hours down)", lag)
	}
	if _, ok := ms["idem.purge.load"]; ok {
		t.Errorf("idem.purge.load after the process's first purge, which has no span: %+v", ms["idem.purge.load"].Data)
	}
	// A second purge, the consumer having run an hour more: its span is
	// that hour, and the load its duration over it.
	mark(4 * time.Hour)
	b.clock.Advance(time.Hour)
	mark(4 * time.Hour)
	if _, err := c.Purge(t.Context()); err != nil {
		t.Fatal(err)
	}
	ms = b.collect(t)
	load, ok := ms["idem.purge.load"].Data.(metricdata.Gauge[float64])
	if !ok || len(load.DataPoints) != 1 || load.DataPoints[0].Value <= 0 || load.DataPoints[0].Value >= 0.01 {
		t.Errorf("idem.purge.load after a purge of an hour's span: %+v, want one point in (0, 0.01)", ms["idem.purge.load"].Data)
	}
	var purgeSpan bool
	for _, s := range b.spans.GetSpans() {
		if s.Name == "purge good" && spanAttr(s, "idem.purge.rows") == "2" {
			purgeSpan = true
		}
	}
	expect(t, "purge span", purgeSpan, true)
}

func TestNewObserverOptions(t *testing.T) {
	t.Parallel()
	for _, opt := range []idemotel.Option{idemotel.WithMeterProvider(nil), idemotel.WithTracerProvider(nil)} {
		if _, err := idemotel.NewObserver(opt); !errors.Is(err, idemotel.ErrInvalidOption) {
			t.Errorf("error %v, want ErrInvalidOption", err)
		}
	}
	// The global providers (no-ops here) are the default.
	obs, err := idemotel.NewObserver()
	if err != nil || obs == nil {
		t.Fatalf("NewObserver(): %v", err)
	}
}

// A batch whose handler fails is an Error span, as a failed single
// delivery is; a batch of duplicates is not. A span never carries an
// empty messaging.message.id.
func TestBatchSpanStatus(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.consumer(t, idem.Config{Name: "payments"})
	ctx := t.Context()
	p := []byte("p")
	ok := func(context.Context, *idem.MemoryTx, []idem.Message) error { return nil }
	boom := func(context.Context, *idem.MemoryTx, []idem.Message) error { return errors.New("boom") }
	_, _ = c.ProcessBatch(ctx, []idem.Message{{ID: "a", Payload: p}}, ok)
	_, _ = c.ProcessBatch(ctx, []idem.Message{{ID: "a", Payload: p}}, ok)   // duplicates only
	_, _ = c.ProcessBatch(ctx, []idem.Message{{ID: "b", Payload: p}}, boom) // failed
	_, _ = c.Process(ctx, idem.Message{ID: "", Payload: p}, func(context.Context, *idem.MemoryTx, idem.Message) error { return nil })
	var got []codes.Code
	for _, s := range b.spans.GetSpans() {
		if spanAttr(s, "messaging.batch.message_count") != "" {
			got = append(got, s.Status.Code)
		}
		for _, kv := range s.Attributes {
			if kv.Key == "messaging.message.id" && kv.Value.Emit() == "" {
				t.Errorf("span %q has an empty messaging.message.id", s.Name)
			}
		}
	}
	if len(got) != 3 || got[0] != codes.Unset || got[1] != codes.Unset || got[2] != codes.Error {
		t.Errorf("batch span statuses %v, want [Unset Unset Error]", got)
	}
}

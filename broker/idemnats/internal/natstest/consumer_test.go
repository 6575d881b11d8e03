package natstest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemnats"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// okProcessor acknowledges everything.
var okProcessor = idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
	return idem.Outcome{Status: idem.Processed, MessageID: msg.ID}, nil
})

func TestNewConsumerConfigErrors(t *testing.T) {
	t.Parallel()
	js, s, cons := inProcessConsumer(t, jetstream.ConsumerConfig{Durable: "c"})
	good := idemnats.Config{Processor: okProcessor, DeadLetter: s.dlSubject}
	tests := []struct {
		name string
		js   jetstream.JetStream
		cons jetstream.Consumer
		edit func(*idemnats.Config)
	}{
		{"nil JetStream", nil, cons, nil},
		{"nil consumer", js, nil, nil},
		{"no processor", js, cons, func(c *idemnats.Config) { c.Processor = nil }},
		{"processor and batch processor", js, cons, func(c *idemnats.Config) {
			c.BatchProcessor = idem.BindBatch[*idem.MemoryTx](nil, nil)
		}},
		{"no dead letter", js, cons, func(c *idemnats.Config) { c.DeadLetter = "" }},
		{"wildcard dead letter", js, cons, func(c *idemnats.Config) { c.DeadLetter = "dead.>" }},
		{"empty token dead letter", js, cons, func(c *idemnats.Config) { c.DeadLetter = "dead..letter" }},
		{"space in dead letter", js, cons, func(c *idemnats.Config) { c.DeadLetter = "dead letter" }},
		{"negative concurrency", js, cons, func(c *idemnats.Config) { c.Concurrency = -1 }},
		{"negative retry delay", js, cons, func(c *idemnats.Config) { c.RetryDelay = -time.Second }},
		{"negative max messages", js, cons, func(c *idemnats.Config) { c.MaxMessages = -1 }},
		{"bad id header", js, cons, func(c *idemnats.Config) { c.IDHeader = "Message Id:" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := good
			if tt.edit != nil {
				tt.edit(&cfg)
			}
			c, err := idemnats.NewConsumer(tt.js, tt.cons, cfg)
			if !errors.Is(err, idem.ErrInvalidConfig) {
				t.Fatalf("NewConsumer = %v, %v; want an error matching idem.ErrInvalidConfig", c, err)
			}
		})
	}
	if _, err := idemnats.NewConsumer(js, cons, good); err != nil {
		t.Fatalf("NewConsumer with a valid config: %v", err)
	}
}

// mappingEnv is one stream, one durable consumer and an idemnats Consumer
// whose Processor returns what the test says.
type mappingEnv struct {
	t       *testing.T
	js      jetstream.JetStream
	s       *testStreams
	cons    jetstream.Consumer
	c       *idemnats.Consumer
	runDone chan error

	mu     sync.Mutex
	calls  map[string][]time.Time // Process calls by payload
	outFor func(call int, msg idem.Message) (idem.Outcome, error)
}

func newMappingEnv(t *testing.T, conn connector, cfg idemnats.Config, outFor func(call int, msg idem.Message) (idem.Outcome, error)) *mappingEnv {
	t.Helper()
	_, js := newJS(t, conn)
	e := &mappingEnv{t: t, js: js, s: newStreams(t, js, time.Minute), calls: map[string][]time.Time{}, outFor: outFor, runDone: make(chan error, 1)}
	var err error
	e.cons, err = e.s.stream.CreateOrUpdateConsumer(context.Background(), jetstream.ConsumerConfig{
		Durable: "map", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 20 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Processor = idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
		e.mu.Lock()
		key := string(msg.Payload)
		e.calls[key] = append(e.calls[key], time.Now())
		n := len(e.calls[key])
		e.mu.Unlock()
		return e.outFor(n, msg)
	})
	if cfg.DeadLetter == "" {
		cfg.DeadLetter = e.s.dlSubject
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger()
	}
	e.c, err = idemnats.NewConsumer(js, e.cons, cfg)
	if err != nil {
		t.Fatal(err)
	}
	go func() { e.runDone <- e.c.Run(context.Background()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := e.c.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
		if err := <-e.runDone; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return e
}

func (e *mappingEnv) publish(id string, payload string) {
	e.t.Helper()
	msg := nats.NewMsg(e.s.subject)
	msg.Data = []byte(payload)
	if id != "" {
		msg.Header.Set(jetstream.MsgIDHeader, id)
	}
	msg.Header.Set("App-Trace", "trace-1")
	if _, err := e.js.PublishMsg(context.Background(), msg); err != nil {
		e.t.Fatal(err)
	}
}

// callTimes waits until payload was processed n times and returns the times.
func (e *mappingEnv) callTimes(payload string, n int) []time.Time {
	e.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		e.mu.Lock()
		ts := append([]time.Time(nil), e.calls[payload]...)
		e.mu.Unlock()
		if len(ts) >= n {
			return ts
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("after 60s: %q processed %d times, want %d", payload, len(ts), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// settled waits until the consumer has nothing pending or unacknowledged.
func (e *mappingEnv) settled() *jetstream.ConsumerInfo {
	e.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		info, err := e.cons.Info(context.Background())
		if err != nil {
			e.t.Fatal(err)
		}
		if info.NumPending == 0 && info.NumAckPending == 0 && info.NumRedelivered == 0 {
			return info
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("after 60s: consumer not settled: pending %d, ack pending %d, redelivered %d", info.NumPending, info.NumAckPending, info.NumRedelivered)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestOutcomeMapping(t *testing.T) {
	t.Parallel()
	conn := inProcess(t)

	t.Run("ProcessedAndDuplicateAreAcked", func(t *testing.T) {
		t.Parallel()
		e := newMappingEnv(t, conn, idemnats.Config{}, func(call int, msg idem.Message) (idem.Outcome, error) {
			st := idem.Processed
			if string(msg.Payload) == "dup" {
				st = idem.Duplicate
			}
			return idem.Outcome{Status: st, MessageID: msg.ID}, nil
		})
		e.publish("a", "new")
		e.publish("b", "dup")
		e.callTimes("new", 1)
		e.callTimes("dup", 1)
		info := e.settled()
		if info.AckFloor.Stream != 2 {
			t.Errorf("ack floor %d, want 2", info.AckFloor.Stream)
		}
	})

	t.Run("InProgressIsNakWithRetryAfter", func(t *testing.T) {
		t.Parallel()
		const retryAfter = 700 * time.Millisecond
		e := newMappingEnv(t, conn, idemnats.Config{RetryDelay: 10 * time.Second}, func(call int, msg idem.Message) (idem.Outcome, error) {
			if call == 1 {
				return idem.Outcome{Status: idem.InProgress, MessageID: msg.ID, Err: idem.ErrInProgress, RetryAfter: retryAfter}, idem.ErrInProgress
			}
			return idem.Outcome{Status: idem.Duplicate, MessageID: msg.ID}, nil
		})
		e.publish("a", "busy")
		ts := e.callTimes("busy", 2)
		if d := ts[1].Sub(ts[0]); d < retryAfter {
			t.Errorf("redelivered after %v, want at least RetryAfter %v", d, retryAfter)
		} else if d > retryAfter+8*time.Second {
			t.Errorf("redelivered after %v, want about RetryAfter %v (not RetryDelay)", d, retryAfter)
		}
		e.settled()
	})

	t.Run("FailedIsNakWithRetryDelay", func(t *testing.T) {
		t.Parallel()
		const retryDelay = 600 * time.Millisecond
		e := newMappingEnv(t, conn, idemnats.Config{RetryDelay: retryDelay}, func(call int, msg idem.Message) (idem.Outcome, error) {
			switch call {
			case 1:
				err := errors.New("boom")
				return idem.Outcome{Status: idem.Failed, MessageID: msg.ID, Err: err}, err
			case 2:
				// An error without an outcome status counts as Failed.
				return idem.Outcome{}, errors.New("no status")
			case 3:
				panic("processor panic")
			}
			return idem.Outcome{Status: idem.Processed, MessageID: msg.ID}, nil
		})
		e.publish("a", "flaky")
		ts := e.callTimes("flaky", 4)
		for i := 1; i < len(ts); i++ {
			if d := ts[i].Sub(ts[i-1]); d < retryDelay {
				t.Errorf("redelivery %d after %v, want at least RetryDelay %v", i, d, retryDelay)
			}
		}
		e.settled()
		if dls, _ := e.s.deadLetters(context.Background()); len(dls) != 0 {
			t.Errorf("%d dead letters, want 0", len(dls))
		}
	})

	t.Run("DeadLetterThenTerm", func(t *testing.T) {
		t.Parallel()
		e := newMappingEnv(t, conn, idemnats.Config{}, func(call int, msg idem.Message) (idem.Outcome, error) {
			var err error
			switch {
			case msg.ID == "":
				err = idem.ErrMissingMessageID
				return idem.Outcome{Status: idem.Rejected, Err: err}, err
			default:
				err = fmt.Errorf("%w: declined", idem.ErrPoison)
				return idem.Outcome{Status: idem.Failed, Poison: true, MessageID: msg.ID, Err: err}, err
			}
		})
		e.publish("", "no id")
		e.publish("p-1", "poison")
		e.callTimes("no id", 1)
		e.callTimes("poison", 1)
		e.settled()
		dls, err := e.s.deadLetters(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(dls) != 2 {
			t.Fatalf("%d dead letters, want 2", len(dls))
		}
		for _, dl := range dls {
			h := dl.Header
			if h.Get("App-Trace") != "trace-1" {
				t.Errorf("dead letter lost the original header App-Trace: %v", h)
			}
			if h.Get(idemnats.HeaderOriginalSubject) != e.s.subject || h.Get(idemnats.HeaderOriginalStream) != e.s.name || h.Get(idemnats.HeaderOriginalSequence) == "" {
				t.Errorf("dead letter lacks its origin headers: %v", h)
			}
			switch string(dl.Data) {
			case "no id":
				if h.Get(idem.HeaderDeadLetterStatus) != "Rejected" || h.Get(idem.HeaderDeadLetterReason) != idem.ReasonMissingMessageID ||
					h.Get(idem.HeaderDeadLetterError) != idem.ErrMissingMessageID.Error() || h.Get(idem.HeaderOriginalMessageID) != "" {
					t.Errorf("dead letter of the ID-less message: headers %v", h)
				}
			case "poison":
				if h.Get(idem.HeaderDeadLetterStatus) != "Failed" || h.Get(idem.HeaderDeadLetterReason) != idem.ReasonPoison ||
					h.Get(idem.HeaderDeadLetterError) != "idem: poison message: declined" || h.Get(idem.HeaderOriginalMessageID) != "p-1" {
					t.Errorf("dead letter of the poison message: headers %v", h)
				}
			default:
				t.Errorf("unexpected dead letter %q", dl.Data)
			}
		}
	})

	t.Run("DeadLetterPublishFailureRedelivers", func(t *testing.T) {
		t.Parallel()
		// No stream captures this subject: the dead-letter publish fails,
		// and the message must not be acknowledged.
		var calls atomic.Int32
		logged := &logMessages{}
		e := newMappingEnv(t, conn, idemnats.Config{DeadLetter: "idemnats.nowhere." + unique(), RetryDelay: 300 * time.Millisecond, Logger: slog.New(logged)},
			func(call int, msg idem.Message) (idem.Outcome, error) {
				calls.Add(1)
				return idem.Outcome{Status: idem.Rejected, Err: idem.ErrMissingMessageID}, idem.ErrMissingMessageID
			})
		e.publish("", "undeliverable")
		e.callTimes("undeliverable", 2) // redelivered, not dropped
		info, err := e.cons.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if info.AckFloor.Stream != 0 {
			t.Errorf("ack floor %d: the message was acknowledged although its dead letter was not stored", info.AckFloor.Stream)
		}
		// The log says what happened: the publish failed, and the message
		// was not dead-lettered. The first delivery's records were written
		// before its Nak, so before the second delivery.
		if n := logged.count("idemnats: message dead-lettered"); n != 0 {
			t.Errorf("%d %q records although no dead letter was published", n, "idemnats: message dead-lettered")
		}
		if n := logged.count("idemnats: dead letter publish failed; the message will be redelivered"); n < 1 {
			t.Errorf("%d records of the failed dead-letter publish, want one per delivery", n)
		}
	})
}

// logMessages is a slog.Handler that keeps the messages of the records
// it is given, every level.
type logMessages struct {
	mu   sync.Mutex
	msgs []string
}

func (h *logMessages) Enabled(context.Context, slog.Level) bool { return true }

func (h *logMessages) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.msgs = append(h.msgs, r.Message)
	return nil
}

func (h *logMessages) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logMessages) WithGroup(string) slog.Handler      { return h }

// count is how many records had message msg.
func (h *logMessages) count(msg string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, m := range h.msgs {
		if m == msg {
			n++
		}
	}
	return n
}

// TestCustomIDHeader: the ID is read from the configured header, and the
// producer writes it there with WithIDHeader.
func TestCustomIDHeader(t *testing.T) {
	t.Parallel()
	conn := inProcess(t)
	var got atomic.Value
	e := newMappingEnv(t, conn, idemnats.Config{IDHeader: "Event-Id"}, func(call int, msg idem.Message) (idem.Outcome, error) {
		got.Store(msg.ID)
		return idem.Outcome{Status: idem.Processed, MessageID: msg.ID}, nil
	})
	p := idemnats.NewProducer(e.js, idemnats.WithIDHeader("Event-Id"))
	id, err := p.Publish(context.Background(), e.s.subject, []byte("x"), idemnats.WithMessageID("order-42"))
	if err != nil || id != "order-42" {
		t.Fatalf("Publish = %q, %v", id, err)
	}
	e.callTimes("x", 1)
	// The call is counted before the Processor stores the ID it saw.
	testenv.Eventually(t, 10*time.Second, "the Processor to see order-42", func() bool { return got.Load() == "order-42" },
		func() string { return fmt.Sprintf("it saw %q", got.Load()) })
}

// TestProgressKeepsLongHandler: with progress reports (the default), a
// handler that runs past the ack wait is not redelivered meanwhile.
func TestProgressKeepsLongHandler(t *testing.T) {
	t.Parallel()
	js, s, cons := inProcessConsumer(t, jetstream.ConsumerConfig{Durable: "slow", AckWait: time.Second})
	ctx := context.Background()
	var calls atomic.Int32
	c, err := idemnats.NewConsumer(js, cons, idemnats.Config{
		Processor: idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
			calls.Add(1)
			time.Sleep(3500 * time.Millisecond) // 3.5 ack waits
			return idem.Outcome{Status: idem.Processed, MessageID: msg.ID}, nil
		}),
		Concurrency: 2, DeadLetter: s.dlSubject, Logger: testLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	runDone := make(chan error, 1)
	go func() { runDone <- c.Run(ctx) }()
	if _, err := idemnats.NewProducer(js).Publish(ctx, s.subject, []byte("slow")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.AckFloor.Stream == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("after 60s: the slow message is not acknowledged")
		}
		time.Sleep(20 * time.Millisecond)
	}
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	if err := <-runDone; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("the slow message was processed %d times, want 1 (progress reports keep it from redelivery)", n)
	}
}

// A Stop whose context ends before the handler in flight finishes cancels
// that handler's context and returns ctx's error; Run then returns nil.
func TestStopTimeoutCancelsHandler(t *testing.T) {
	t.Parallel()
	js, s, cons := inProcessConsumer(t, jetstream.ConsumerConfig{Durable: "life"})
	ctx := context.Background()
	cfg := idemnats.Config{Processor: okProcessor, DeadLetter: s.dlSubject, Logger: testLogger()}

	// Stop whose context ends first cancels the handler and returns ctx's error.
	entered := make(chan struct{})
	handlerErr := make(chan error, 1)
	cfg3 := cfg
	cfg3.Processor = idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
		close(entered)
		<-ctx.Done()
		handlerErr <- context.Cause(ctx)
		return idem.Outcome{Status: idem.Failed, Err: ctx.Err()}, ctx.Err()
	})
	c3, _ := idemnats.NewConsumer(js, cons, cfg3)
	done3 := make(chan error, 1)
	go func() { done3 <- c3.Run(ctx) }()
	if _, err := idemnats.NewProducer(js).Publish(ctx, s.subject, []byte("stuck")); err != nil {
		t.Fatal(err)
	}
	<-entered
	sctx, scancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer scancel()
	if err := c3.Stop(sctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop with a stuck handler = %v, want context.DeadlineExceeded", err)
	}
	if err := <-handlerErr; err == nil {
		t.Fatal("the stuck handler's context was not cancelled")
	}
	if err := <-done3; err != nil {
		t.Fatalf("Run after Stop = %v, want nil", err)
	}
}

func TestProducer(t *testing.T) {
	t.Parallel()
	conn := inProcess(t)
	_, js := newJS(t, conn)
	s := newStreams(t, js, time.Minute)
	ctx := context.Background()
	p := idemnats.NewProducer(js)

	id, err := p.Publish(ctx, s.subject, []byte("one"))
	if err != nil {
		t.Fatal(err)
	}
	if u, err := uuid.Parse(id); err != nil || u.Version() != 7 {
		t.Errorf("default ID %q is not a UUIDv7 (%v)", id, err)
	}
	// The same business key twice: JetStream's duplicate window drops the
	// second publish, and Publish still succeeds.
	for range 2 {
		if id, err := p.Publish(ctx, s.subject, []byte("order"), idemnats.WithMessageID("order-7"),
			idemnats.WithHeader(nats.Header{"Tenant": []string{"acme"}, jetstream.MsgIDHeader: []string{"other"}})); err != nil || id != "order-7" {
			t.Fatalf("Publish = %q, %v", id, err)
		}
	}
	info, err := s.stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 2 {
		t.Errorf("stream holds %d messages, want 2 (the repeat deduplicated by the server)", info.State.Msgs)
	}
	m, err := s.stream.GetMsg(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if m.Header.Get(jetstream.MsgIDHeader) != "order-7" || m.Header.Get("Tenant") != "acme" {
		t.Errorf("stored headers %v", m.Header)
	}

	for _, bad := range []struct {
		id   string
		want error
	}{{"", idem.ErrMissingMessageID}, {"a\x01b", idem.ErrInvalidMessageID}, {string(make([]byte, 256)), idem.ErrInvalidMessageID}} {
		if _, err := p.Publish(ctx, s.subject, []byte("x"), idemnats.WithMessageID(bad.id)); !errors.Is(err, bad.want) {
			t.Errorf("Publish with ID %q = %v, want %v", bad.id, err, bad.want)
		}
	}
	if _, err := p.Publish(ctx, "idemnats.nowhere."+unique(), []byte("x")); err == nil {
		t.Error("Publish to a subject no stream captures succeeded")
	}
}

// TestHandlerTimeoutEndsKeepAlive: a handler stuck past HandlerTimeout,
// ignoring its context, no longer holds its message: the progress reports
// stop, the ack wait runs out, and JetStream redelivers it to another
// worker, whose outcome settles it.
func TestHandlerTimeoutEndsKeepAlive(t *testing.T) {
	t.Parallel()
	js, s, cons := inProcessConsumer(t, jetstream.ConsumerConfig{Durable: "stuck", AckWait: time.Second})
	ctx := context.Background()
	release := make(chan struct{})
	var calls atomic.Int32
	var ctxEnded atomic.Bool
	c, err := idemnats.NewConsumer(js, cons, idemnats.Config{
		Processor: idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
			if calls.Add(1) == 1 {
				<-ctx.Done() // HandlerTimeout ends it...
				ctxEnded.Store(true)
				<-release // ...but the handler ignores that and stays stuck
				return idem.Outcome{Status: idem.Failed, MessageID: msg.ID, Err: ctx.Err()}, ctx.Err()
			}
			return idem.Outcome{Status: idem.Processed, MessageID: msg.ID}, nil
		}),
		Concurrency: 2, DeadLetter: s.dlSubject, Logger: testLogger(),
		HandlerTimeout: 1500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer close(release)
	runDone := make(chan error, 1)
	go func() { runDone <- c.Run(ctx) }()
	if _, err := idemnats.NewProducer(js).Publish(ctx, s.subject, []byte("stuck")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for calls.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("after 60s: the message held by a stuck handler was not redelivered")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !ctxEnded.Load() {
		t.Error("the stuck handler's context did not end at HandlerTimeout")
	}
	for {
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.AckFloor.Stream == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("after 60s: the redelivery was not acknowledged")
		}
		time.Sleep(20 * time.Millisecond)
	}
	release <- struct{}{}
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	if err := <-runDone; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

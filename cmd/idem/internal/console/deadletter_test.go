package console_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemnats"
	"github.com/idem-go/idem/broker/idemredisstream"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/cmd/idem/internal/deadletter"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/testenv"
)

func suffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// runUntilCleanup runs run in a goroutine until the test ends.
func runUntilCleanup(t *testing.T, run func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// handled is a lease handler that fails until healed, and counts its
// successful runs per message ID.
type handled struct {
	mu     sync.Mutex
	healed bool
	runs   map[string]int
}

func (h *handled) handle(_ context.Context, a *idem.Attempt) (idem.Result, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.healed {
		return idem.Result{}, errors.New("ledger unavailable for " + a.Message.ID)
	}
	h.runs[a.Message.ID]++
	return idem.Result{Body: []byte("ok")}, nil
}

func (h *handled) heal() { h.mu.Lock(); h.healed = true; h.mu.Unlock() }
func (h *handled) count(id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.runs[id]
}

// brokerCase is a real broker with a source and a dead-letter destination
// that an idem adapter consumes with p.
type brokerCase struct {
	dls      console.DeadLetters
	dest     string
	publish  func(id string)      // publishes the original of id to the source
	inSource func() int           // messages in the source
	consume  func(idem.Processor) // runs the adapter until the test ends
}

// replayOnce runs the scenario of a dead letter replayed from the console:
// three messages poisoned by a failing handler are dead-lettered by the
// adapter; the console lists them newest first, grouped by cause; a replay
// confirmed and posted twice republishes one copy, which is processed
// once; a second replay is refused; the same through Run (the CLI's call)
// for another dead letter.
func replayOnce(t *testing.T, store console.Store, ls idemdriver.LeaseStore, b brokerCase) {
	consumer := "payments-" + suffix()
	lc, err := idem.NewLeaseConsumer(ls, idem.Config{Name: consumer, MaxAttempts: 1, PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lc.Close() })
	h := &handled{runs: map[string]int{}}
	b.consume(idem.BindLease(lc, h.handle))
	for _, id := range []string{"pay-1", "pay-2", "pay-3"} {
		b.publish(id)
	}
	testenv.Eventually(t, 20*time.Second, "three dead letters", func() bool {
		dl, _, err := b.dls.Newest(t.Context(), b.dest, "", 10)
		return err == nil && len(dl) == 3
	}, nil)

	f := newFixture(t, store, console.Config{DeadLetters: b.dls, DeadLetterDests: []string{b.dest + "=" + consumer}})
	var v console.DeadLettersView
	code, body, _ := f.get("/api/deadletters?dest=" + b.dest + "&consumer=" + consumer + "&limit=2")
	if err := json.Unmarshal([]byte(body), &v); err != nil || code != 200 {
		t.Fatalf("api/deadletters: %d %s", code, body)
	}
	if len(v.Groups) != 1 || v.Groups[0].Count != 3 || v.Groups[0].Reason != idem.ReasonPoison || v.Scanned != 3 ||
		!strings.Contains(v.Groups[0].Error, `"<id>"`) || !strings.Contains(v.Groups[0].Error, "ledger unavailable for <id>") {
		t.Errorf("groups: %+v (scanned %d), want one cause, poison, 3 dead letters, the IDs left out", v.Groups, v.Scanned)
	}
	if len(v.Letters) != 2 || v.Letters[0].MessageID != "pay-3" || v.Letters[1].MessageID != "pay-2" || v.Next == "" {
		t.Fatalf("page 1: %+v next %q, want pay-3, pay-2 and a next page", v.Letters, v.Next)
	}
	if strings.Contains(body, "body-pay") {
		t.Errorf("payload shown without ShowPayloads: %s", body)
	}
	_, body, _ = f.get("/api/deadletters?dest=" + b.dest + "&consumer=" + consumer + "&limit=2&cursor=" + v.Next)
	var p2 console.DeadLettersView
	if err := json.Unmarshal([]byte(body), &p2); err != nil || len(p2.Letters) != 1 || p2.Letters[0].MessageID != "pay-1" {
		t.Fatalf("page 2: %s", body)
	}
	if _, html, _ := f.get("/deadletters?dest=" + b.dest + "&consumer=" + consumer); !strings.Contains(html, "action=replay") {
		t.Errorf("the page offers no replay: %s", html)
	}
	pos2 := v.Letters[1].Position
	before := b.inSource()

	h.heal()
	form := f.confirmForm("action=replay&consumer=" + consumer + "&dead_letter=" + b.dest + "&position=" + pos2)
	forged := url.Values{}
	for k, v := range form {
		forged[k] = v
	}
	forged.Set("csrf", strings.Repeat("0", 64))
	if code, _ := f.post("/action", forged); code != http.StatusForbidden || b.inSource() != before {
		t.Fatalf("replay with a forged CSRF token: %d, %d copies published; want 403 and none", code, b.inSource()-before)
	}
	for range 2 { // a double click
		if code, body := f.post("/action", form); code != http.StatusOK || !strings.Contains(body, "replayed") {
			t.Fatalf("replay: %d %s", code, body)
		}
	}
	testenv.Eventually(t, 20*time.Second, "the replay processed", func() bool {
		rec, err := store.Inspect(t.Context(), consumer, "pay-2")
		return err == nil && rec.State == idemdriver.StateCompleted
	}, nil)
	if n := h.count("pay-2"); n != 1 {
		t.Errorf("pay-2 processed %d times after the replay, want 1", n)
	}
	if n := b.inSource() - before; n != 1 {
		t.Errorf("%d copies published to the source, want 1", n)
	}
	again := f.confirmForm("action=replay&consumer=" + consumer + "&dead_letter=" + b.dest + "&position=" + pos2)
	if code, body := f.post("/action", again); code != http.StatusConflict || !strings.Contains(body, "completed") {
		t.Errorf("second replay: %d %s, want 409 saying it is completed", code, body)
	}
	if got := testutil.ToFloat64(mustCounter(t, f.reg, "replay", "changed")); got != 1 {
		t.Errorf("replays counted %v, want 1", got)
	}
	if got := testutil.ToFloat64(mustCounter(t, f.reg, "replay", "refused")); got != 1 {
		t.Errorf("refusals counted %v, want 1", got)
	}
	if !strings.Contains(f.log.String(), `"action":"replay"`) {
		t.Errorf("no audit line: %s", f.log)
	}

	// The CLI's call: replay pay-1; a retried record waiting for its
	// delivery is refused, unless forced.
	pos1 := p2.Letters[0].Position
	a := console.Action{Kind: console.ActionReplay, Consumer: consumer, DeadLetter: b.dest, Position: pos1}
	if _, err := store.RetryRecord(t.Context(), consumer, "pay-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := console.Run(t.Context(), store, b.dls, a, time.Now); !errors.Is(err, console.ErrNotReplayable) || !errors.Is(err, console.ErrForceable) {
		t.Errorf("replay of a retried record: %v, want ErrNotReplayable, forceable", err)
	}
	if code, body := f.post("/action", f.confirmForm("action=replay&consumer="+consumer+"&dead_letter="+b.dest+"&position="+pos1)); code != http.StatusConflict ||
		!strings.Contains(body, `id="force"`) || !strings.Contains(body, "force=true") {
		t.Errorf("console replay of a retried record: %d %s, want 409 and a link to force it", code, body)
	}
	a.Force = true
	if res, err := console.Run(t.Context(), store, b.dls, a, time.Now); err != nil || !res.Changed {
		t.Fatalf("forced replay: %+v %v", res, err)
	}
	testenv.Eventually(t, 20*time.Second, "the forced replay processed", func() bool { return h.count("pay-1") == 1 }, nil)
	if n := b.inSource() - before; n != 2 {
		t.Errorf("%d copies published to the source, want 2", n)
	}
	if h.count("pay-3") != 0 {
		t.Errorf("pay-3 ran without a replay")
	}
}

// JetStream's dead letters with a PostgreSQL store; and a replay that the
// source stream's duplicate window would drop is refused before anything
// changes, and one the server drops anyway is reported, not claimed.
func TestJetStreamDeadLettersReplayedOnce(t *testing.T) {
	store, _, _ := pgStore(t)
	nc, err := nats.Connect(testenv.URL(t, "IDEM_TEST_NATS_URL", "nats://127.0.0.1:4222"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	sfx := suffix()
	src, dest := "console."+sfx+".pay", "console."+sfx+".dead"
	newStream := func(name, subject string, dup time.Duration) jetstream.Stream {
		s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject}, Storage: jetstream.MemoryStorage, Duplicates: dup})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
		return s
	}
	// The originals carry their ID in a header of their own, not in
	// Nats-Msg-Id, so that the stream's duplicate window does not drop the
	// replays (the window's own case is below).
	srcStream := newStream("CONSOLE_SRC_"+sfx, src, 0)
	newStream("CONSOLE_DEAD_"+sfx, dest, 0)
	run := func(s jetstream.Stream, subject, idHeader string) func(idem.Processor) {
		return func(p idem.Processor) {
			cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "idem", FilterSubject: subject, AckPolicy: jetstream.AckExplicitPolicy})
			if err != nil {
				t.Fatal(err)
			}
			c, err := idemnats.NewConsumer(js, cons, idemnats.Config{Processor: p, DeadLetter: dest, IDHeader: idHeader})
			if err != nil {
				t.Fatal(err)
			}
			runUntilCleanup(t, c.Run)
		}
	}
	prod := idemnats.NewProducer(js)
	dls := deadletter.NewJetStream(js, "NATS", nil)
	replayOnce(t, store, store, brokerCase{
		dls: dls, dest: dest, consume: run(srcStream, src, "Idem-Message-Id"),
		publish: func(id string) {
			m := nats.NewMsg(src)
			m.Data = []byte("body-" + id)
			m.Header.Set("Idem-Message-Id", id)
			if _, err := js.PublishMsg(ctx, m); err != nil {
				t.Fatal(err)
			}
		},
		inSource: func() int {
			info, err := srcStream.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return int(info.State.Msgs)
		},
	})

	// A source stream that remembers IDs for 2 minutes.
	src2 := "console." + sfx + ".slow"
	slow := newStream("CONSOLE_SLOW_"+sfx, src2, 2*time.Minute)
	lc, err := idem.NewLeaseConsumer(store, idem.Config{Name: "slow-" + sfx, MaxAttempts: 1, PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	run(slow, src2, "")(idem.BindLease(lc, func(context.Context, *idem.Attempt) (idem.Result, error) {
		return idem.Result{}, errors.New("still broken")
	}))
	if _, err := prod.Publish(ctx, src2, []byte("x"), idemnats.WithMessageID("slow-1")); err != nil {
		t.Fatal(err)
	}
	var pos string
	testenv.Eventually(t, 20*time.Second, "the dead letter of slow-1", func() bool {
		dl, _, err := dls.Newest(ctx, dest, "", 1)
		if err == nil && len(dl) == 1 && dl[0].MessageID == "slow-1" {
			pos = dl[0].Position
		}
		return pos != ""
	}, nil)
	a := console.Action{Kind: console.ActionReplay, Consumer: "slow-" + sfx, DeadLetter: dest, Position: pos}
	_, err = console.Run(ctx, store, dls, a, time.Now)
	if !errors.Is(err, console.ErrReplayDropped) || !strings.Contains(err.Error(), "replay after") {
		t.Errorf("replay within the window: %v, want ErrReplayDropped saying when", err)
	}
	if rec, _ := store.Inspect(ctx, "slow-"+sfx, "slow-1"); rec.State != idemdriver.StateFailed {
		t.Errorf("record %s after a refused replay, want failed (nothing changed)", rec.State)
	}
	// A reader whose clock is past the window (or a window the pre-check
	// cannot see) publishes; the server drops the copy, and says so.
	late := deadletter.NewJetStream(js, "NATS", func() time.Time { return time.Now().Add(3 * time.Minute) })
	_, err = console.Run(ctx, store, late, a, time.Now)
	if !errors.Is(err, console.ErrReplayDropped) || !strings.Contains(err.Error(), "dropped the copy") || !strings.Contains(err.Error(), "force") {
		t.Errorf("replay the server drops: %v, want ErrReplayDropped saying to force later", err)
	}
	if info, _ := slow.Info(ctx); info.State.Msgs != 1 {
		t.Errorf("the slow stream holds %d messages, want the original alone", info.State.Msgs)
	}
}

// Redis Streams' dead letters with a PostgreSQL store.
func TestRedisStreamsDeadLettersReplayedOnce(t *testing.T) {
	store, _, _ := pgStore(t)
	rdb, src, dest := redisStreams(t)
	ctx := t.Context()
	prod := idemredisstream.NewProducer(rdb, idemredisstream.ProducerConfig{})
	replayOnce(t, store, store, brokerCase{
		dls: deadletter.NewRedisStreams(rdb, "Redis"), dest: dest,
		consume: func(p idem.Processor) {
			c, err := idemredisstream.NewConsumer(rdb, idemredisstream.Config{Processor: p, Stream: src, Group: "idem", Consumer: "c1",
				DeadLetter: dest, Block: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			runUntilCleanup(t, c.Run)
		},
		publish: func(id string) {
			if _, err := prod.Publish(ctx, src, []byte("body-"+id), idemredisstream.WithMessageID(id)); err != nil {
				t.Fatal(err)
			}
		},
		inSource: func() int {
			n, err := rdb.XLen(ctx, src).Result()
			if err != nil {
				t.Fatal(err)
			}
			return int(n)
		},
	})
}

// Without --broker the dead-letters page says how to get one; a broker
// whose queues cannot be browsed says why; read-only offers no replay and
// runs none.
func TestDeadLettersWithoutABrowsableBroker(t *testing.T) {
	store := idem.NewMemoryStore(nil)
	f := newFixture(t, store, console.Config{})
	if code, body, _ := f.get("/api/deadletters"); code != http.StatusNotFound || !strings.Contains(body, "--broker") {
		t.Errorf("no broker: %d %s", code, body)
	}
	q := newFixture(t, store, console.Config{DeadLetters: deadletter.Unbrowsable{Broker: "RabbitMQ at amqp://host/"}, DeadLetterDests: []string{"orders-dead=orders"}})
	if code, body, _ := q.get("/api/deadletters"); code != 200 || !strings.Contains(body, `"consumer": "orders"`) {
		t.Errorf("index: %d %s", code, body)
	}
	if code, body, _ := q.get("/deadletters?dest=orders-dead&consumer=orders"); code != http.StatusNotFound || !strings.Contains(body, "cannot be read without taking its messages") {
		t.Errorf("RabbitMQ: %d %s", code, body)
	}
	ro := newFixture(t, store, console.Config{ReadOnly: true, DeadLetters: deadletter.Unbrowsable{Broker: "x"}})
	if code, _ := ro.post("/action", map[string][]string{"action": {"replay"}, "consumer": {"c"}, "dead_letter": {"d"}, "position": {"1"}}); code != http.StatusNotFound && code != http.StatusMethodNotAllowed {
		t.Errorf("read-only replay: %d", code)
	}
}

// A stream that captures other subjects beside the dead-letter subject is
// read over windows of sequences (104 for a page of one; some windows
// hold no dead letter): paging newest first yields every dead letter
// once, in order, and nothing else.
func TestJetStreamDeadLettersInASharedStream(t *testing.T) {
	nc, err := nats.Connect(testenv.URL(t, "IDEM_TEST_NATS_URL", "nats://127.0.0.1:4222"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	ctx := t.Context()
	sfx := suffix()
	name := "CONSOLE_SHARED_" + sfx
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{"shared." + sfx + ".>"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	dest := "shared." + sfx + ".dead"
	for i := range 400 {
		subject, id := "shared."+sfx+".orders", ""
		if i%40 == 0 {
			subject, id = dest, "m-"+strconv.Itoa(i)
		}
		m := nats.NewMsg(subject)
		m.Header.Set(idem.HeaderOriginalMessageID, id)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	dls := deadletter.NewJetStream(js, "NATS", nil)
	var got []string
	cursor := ""
	for range 50 {
		page, next, err := dls.Newest(ctx, dest, cursor, 1)
		if err != nil {
			t.Fatal(err)
		}
		for _, dl := range page {
			got = append(got, dl.MessageID)
		}
		if next == "" {
			break
		}
		cursor = next
	}
	want := "m-360 m-320 m-280 m-240 m-200 m-160 m-120 m-80 m-40 m-0"
	if strings.Join(got, " ") != want {
		t.Errorf("paged %v, want %s", got, want)
	}
}

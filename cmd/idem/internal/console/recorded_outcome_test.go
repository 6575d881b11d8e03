package console_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemredisstream"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/cmd/idem/internal/deadletter"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/idemsql"
)

// redisStreams connects to the suite's Redis and names a source and a
// dead-letter stream of the test's own, deleted when it ends.
func redisStreams(t *testing.T) (rdb *redis.Client, src, dest string) {
	t.Helper()
	opts, err := redis.ParseURL(testenv.URL(t, "IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"))
	if err != nil {
		t.Fatal(err)
	}
	rdb = redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	sfx := suffix()
	src, dest = "console:"+sfx+":src", "console:"+sfx+":dead"
	t.Cleanup(func() { rdb.Del(context.Background(), src, dest) })
	return rdb, src, dest
}

// sidecar is idem consume's delivery path, as the command assembles it:
// a Deliverer on a PostgreSQL store, driven by the Redis Streams adapter,
// calling a service that answers with broken until it is fixed, then 200.
type sidecar struct {
	t             *testing.T
	store         *idemsql.Store
	rdb           *redis.Client
	src, dest     string
	consumer      string
	dls           console.DeadLetters
	calls, fixedN atomic.Int64
	fixed         atomic.Bool
}

func newSidecar(t *testing.T, broken http.HandlerFunc) *sidecar {
	t.Helper()
	s := &sidecar{t: t, consumer: "orders-" + suffix()}
	s.store, _, _ = pgStore(t)
	s.rdb, s.src, s.dest = redisStreams(t)
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.calls.Add(1)
		if !s.fixed.Load() {
			broken(w, r)
			return
		}
		s.fixedN.Add(1)
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"accepted":true}`)
	}))
	t.Cleanup(svc.Close)
	target, _ := url.Parse(svc.URL)
	lc, err := idem.NewLeaseConsumer(s.store, idem.Config{Name: s.consumer, PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lc.Close() })
	d, err := idemhttp.NewDeliverer(lc, idemhttp.DelivererOptions{Target: target})
	if err != nil {
		t.Fatal(err)
	}
	c, err := idemredisstream.NewConsumer(s.rdb, idemredisstream.Config{Processor: d, Stream: s.src, Group: "idem", Consumer: "c1",
		DeadLetter: s.dest, Block: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runUntilCleanup(t, c.Run)
	s.dls = deadletter.NewRedisStreams(s.rdb, "Redis")
	return s
}

// deadLettered publishes message id and waits for its dead letter, with
// reason; it returns the dead letter's position.
func (s *sidecar) deadLettered(id, reason string) string {
	s.t.Helper()
	prod := idemredisstream.NewProducer(s.rdb, idemredisstream.ProducerConfig{})
	if _, err := prod.Publish(s.t.Context(), s.src, []byte(`{"order":1}`), idemredisstream.WithMessageID(id)); err != nil {
		s.t.Fatal(err)
	}
	var pos string
	testenv.Eventually(s.t, 20*time.Second, "the message dead-lettered as "+reason, func() bool {
		page, _, err := s.dls.Newest(s.t.Context(), s.dest, "", 10)
		if err != nil || len(page) != 1 {
			return false
		}
		pos = page[0].Position
		return page[0].Reason == reason && page[0].MessageID == id
	}, nil)
	return pos
}

// streamLen is the number of entries of stream.
func (s *sidecar) streamLen(stream string) int64 {
	s.t.Helper()
	n, err := s.rdb.XLen(s.t.Context(), stream).Result()
	if err != nil {
		s.t.Fatal(err)
	}
	return n
}

// record inspects id's record and reads its stored answer.
func (s *sidecar) record(id string) (rec idemdriver.Record, reason string, dead bool) {
	s.t.Helper()
	rec, err := s.store.Inspect(s.t.Context(), s.consumer, id)
	if err != nil {
		s.t.Fatalf("Inspect(%q): %v", id, err)
	}
	reason, dead = idemhttp.DeadLetterAnswer(rec.ContentType, rec.Result)
	return rec, reason, dead
}

// noReopen is a store that cannot reopen records (it hides the PostgreSQL
// store's ReopenRecord), as a store outside idem may be.
type noReopen struct{ console.Store }

func refuse422(w http.ResponseWriter, _ *http.Request) {
	http.Error(w, "order rejected", http.StatusUnprocessableEntity)
}

// hangUp reads the request and closes the connection without an answer:
// the call's outcome is unknown.
func hangUp(w http.ResponseWriter, r *http.Request) {
	_, _ = io.ReadAll(r.Body)
	if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
		conn.Close()
	}
}

// A message the Deliverer dead-lettered because the service answered 422
// has a completed record holding that answer. Once the service is fixed,
// its replay from the console reopens the record and republishes it: the
// service is called once more, the record completes with its 200, and no
// other dead letter is written. A second replay, forced or not, is
// refused as a success and publishes nothing; a store that cannot reopen
// refuses the first one with ErrRecordedOutcome.
func TestReplayReopensARefusal(t *testing.T) {
	testReplayReopens(t, refuse422, idem.ReasonPermanent)
}

// The same for a call whose outcome was unknown (the service hung up
// after reading the request): the replay calls it again.
func TestReplayReopensAnUnknownOutcome(t *testing.T) {
	testReplayReopens(t, hangUp, idem.ReasonOutcomeUnknown)
}

func testReplayReopens(t *testing.T, broken http.HandlerFunc, reason string) {
	s := newSidecar(t, broken)
	ctx := t.Context()
	pos := s.deadLettered("order-1", reason)
	rec, got, dead := s.record("order-1")
	if rec.State != idemdriver.StateCompleted || !dead || got != reason {
		t.Fatalf("record: %+v, dead-letter answer %q %v; want completed with a %s answer", rec, got, dead, reason)
	}
	if n := s.calls.Load(); n != 1 {
		t.Fatalf("service called %d times before the replay, want 1", n)
	}
	before := s.streamLen(s.src)
	a := console.Action{Kind: console.ActionReplay, Consumer: s.consumer, DeadLetter: s.dest, Position: pos}

	_, err := console.Replay(ctx, noReopen{s.store}, s.dls, a, time.Now)
	if !errors.Is(err, console.ErrRecordedOutcome) || !errors.Is(err, console.ErrNotReplayable) || errors.Is(err, console.ErrForceable) ||
		!strings.Contains(err.Error(), "new message ID") {
		t.Errorf("replay on a store that cannot reopen: %v; want ErrRecordedOutcome, not forceable, saying what to do", err)
	}
	if n := s.streamLen(s.src); n != before {
		t.Fatalf("%d copies published by a refused replay, want none", n-before)
	}

	s.fixed.Store(true)
	f := newFixture(t, s.store, console.Config{DeadLetters: s.dls, DeadLetterDests: []string{s.dest + "=" + s.consumer}})
	form := f.confirmForm("action=replay&consumer=" + s.consumer + "&dead_letter=" + s.dest + "&position=" + pos)
	if code, body := f.post("/action", form); code != http.StatusOK || !strings.Contains(body, "replayed") || !strings.Contains(body, "reopened") {
		t.Fatalf("console replay: %d %s; want 200 saying the record was reopened", code, body)
	}
	testenv.Eventually(t, 20*time.Second, "the replay processed", func() bool {
		rec, err := s.store.Inspect(ctx, s.consumer, "order-1")
		return err == nil && rec.State == idemdriver.StateCompleted
	}, nil)
	done, got, dead := s.record("order-1")
	if dead || got != "" || !strings.Contains(string(done.Result), `"status":200`) || done.Token <= rec.Token {
		t.Errorf("record after the replay: %+v (dead-letter answer %q %v); want completed with the 200 under a later token than %d", done, got, dead, rec.Token)
	}
	if n, fixed := s.calls.Load(), s.fixedN.Load(); n != 2 || fixed != 1 {
		t.Errorf("service called %d times (%d after the fix), want 2 (1)", n, fixed)
	}
	if n := s.streamLen(s.src) - before; n != 1 {
		t.Errorf("%d copies published by the replay, want 1", n)
	}
	if n := s.streamLen(s.dest); n != 1 {
		t.Errorf("%d dead letters, want 1: the replay was not dead-lettered", n)
	}

	published := s.streamLen(s.src)
	for _, force := range []bool{false, true} {
		a.Force = force
		_, err := console.Replay(ctx, s.store, s.dls, a, time.Now)
		if !errors.Is(err, console.ErrNotReplayable) || !errors.Is(err, idemdriver.ErrWrongState) || errors.Is(err, console.ErrForceable) ||
			errors.Is(err, console.ErrRecordedOutcome) || !strings.Contains(err.Error(), "processed") {
			t.Errorf("second replay (force %v): %v; want refused as processed, not forceable", force, err)
		}
	}
	again := f.confirmForm("action=replay&consumer=" + s.consumer + "&dead_letter=" + s.dest + "&position=" + pos)
	if code, body := f.post("/action", again); code != http.StatusConflict || !strings.Contains(body, "processed") || strings.Contains(body, "Replay anyway") {
		t.Errorf("second console replay: %d %s; want 409, no force offered", code, body)
	}
	if n := s.streamLen(s.src); n != published {
		t.Errorf("%d copies published by refused replays, want none", n-published)
	}
	if n := s.calls.Load(); n != 2 {
		t.Errorf("service called %d times after the refusals, want 2", n)
	}
	if after, _, _ := s.record("order-1"); after.Token != done.Token || after.State != idemdriver.StateCompleted {
		t.Errorf("record after the refusals: %+v; want it unchanged", after)
	}
	if got := testutil.ToFloat64(mustCounter(t, f.reg, "replay", "changed")); got != 1 {
		t.Errorf("replays counted %v, want 1", got)
	}
	if log := f.log.String(); !strings.Contains(log, `"action":"replay"`) || !strings.Contains(log, `"result":"changed"`) || !strings.Contains(log, `"result":"refused"`) {
		t.Errorf("audit log: %s; want the replay changed, then refused", log)
	}
}

package console_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemredisstream"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/cmd/idem/internal/deadletter"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/internal/testenv"
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

// A message idem consume's Deliverer dead-letters because the service
// answered 422 has a completed record holding that answer. Its replay is
// refused with ErrRecordedOutcome (not forceable, forced or not, in the
// API and on the console), nothing is published and the service is not
// called again.
func TestReplayOfARecordedOutcomeRefused(t *testing.T) {
	store, _, _ := pgStore(t)
	rdb, src, dest := redisStreams(t)
	ctx := t.Context()

	var calls atomic.Int64
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		http.Error(w, "order rejected", http.StatusUnprocessableEntity)
	}))
	t.Cleanup(svc.Close)
	target, _ := url.Parse(svc.URL)
	consumer := "orders-" + suffix()
	lc, err := idem.NewLeaseConsumer(store, idem.Config{Name: consumer, PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lc.Close() })
	d, err := idemhttp.NewDeliverer(lc, idemhttp.DelivererOptions{Target: target})
	if err != nil {
		t.Fatal(err)
	}
	c, err := idemredisstream.NewConsumer(rdb, idemredisstream.Config{Processor: d, Stream: src, Group: "idem", Consumer: "c1",
		DeadLetter: dest, Block: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runUntilCleanup(t, c.Run)
	prod := idemredisstream.NewProducer(rdb, idemredisstream.ProducerConfig{})
	if _, err := prod.Publish(ctx, src, []byte(`{"order":1}`), idemredisstream.WithMessageID("order-1")); err != nil {
		t.Fatal(err)
	}
	dls := deadletter.NewRedisStreams(rdb, "Redis")
	var pos string
	testenv.Eventually(t, 20*time.Second, "the 422 dead-lettered", func() bool {
		page, _, err := dls.Newest(ctx, dest, "", 10)
		if err != nil || len(page) != 1 {
			return false
		}
		pos = page[0].Position
		return page[0].Reason == idem.ReasonPermanent && page[0].MessageID == "order-1"
	}, nil)
	if rec, err := store.Inspect(ctx, consumer, "order-1"); err != nil || rec.State != idemdriver.StateCompleted {
		t.Fatalf("record: %+v, %v; want completed", rec, err)
	}
	inSource := func() int64 {
		n, err := rdb.XLen(ctx, src).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := inSource()

	for _, force := range []bool{false, true} {
		a := console.Action{Kind: console.ActionReplay, Consumer: consumer, DeadLetter: dest, Position: pos, Force: force}
		_, err := console.Replay(ctx, store, dls, a, time.Now)
		if !errors.Is(err, console.ErrRecordedOutcome) || !errors.Is(err, console.ErrNotReplayable) || errors.Is(err, console.ErrForceable) ||
			!strings.Contains(err.Error(), `reason is "permanent"`) || !strings.Contains(err.Error(), "new message ID") {
			t.Errorf("replay (force %v): %v; want ErrRecordedOutcome, not forceable, saying what to do", force, err)
		}
	}
	f := newFixture(t, store, console.Config{DeadLetters: dls, DeadLetterDests: []string{dest + "=" + consumer}})
	form := f.confirmForm("action=replay&consumer=" + consumer + "&dead_letter=" + dest + "&position=" + pos)
	if code, body := f.post("/action", form); code != http.StatusConflict || !strings.Contains(body, "new message ID") || strings.Contains(body, "Replay anyway") {
		t.Errorf("console replay: %d %s; want 409 saying what to do, no force offered", code, body)
	}
	if n := inSource(); n != before {
		t.Errorf("%d copies published by refused replays, want none", n-before)
	}
	if rec, err := store.Inspect(ctx, consumer, "order-1"); err != nil || rec.State != idemdriver.StateCompleted {
		t.Errorf("record after the refusals: %+v, %v; want completed, unchanged", rec, err)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("service called %d times, want 1", n)
	}
}

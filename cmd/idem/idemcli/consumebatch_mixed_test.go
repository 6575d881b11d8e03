package idemcli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testenv"
)

// publishAgain publishes m, again and again while JetStream reports it a
// duplicate (its ID within the stream's duplicates window), so that the
// stream holds the same ID twice.
func publishAgain(t *testing.T, js jetstream.JetStream, m *nats.Msg) {
	t.Helper()
	for {
		ack, err := js.PublishMsg(context.Background(), m)
		if err != nil {
			t.Fatal(err)
		}
		if !ack.Duplicate {
			return
		}
	}
}

// batchClaimSetup returns the Redis store of a --batch-claim test (its
// URL and a --redis-prefix of its own), and a JetStream server with the
// stream name capturing subject and its dead-letter subject (subject.dead)
// under a duplicates window of 100ms, so that publishAgain can store an
// ID twice.
func batchClaimSetup(t *testing.T, name, subject string) (redisURL, prefix, brokerURL string, js jetstream.JetStream) {
	t.Helper()
	redisURL = testenv.URL(t, testenv.RedisEnv, "redis://127.0.0.1:6379/0")
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	prefix = "idem-" + strings.ToLower(name) + "-" + hex.EncodeToString(rnd[:]) + ":"
	brokerURL = "nats://idem:pw@" + startNATS(t, "idem", "pw")
	nc, err := nats.Connect(brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: name, Subjects: []string{subject, subject + ".dead"},
		Duplicates: 100 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	return redisURL, prefix, brokerURL, js
}

// logged reports whether a line of log has every one of parts.
func logged(log string, parts ...string) bool {
line:
	for l := range strings.Lines(log) {
		for _, p := range parts {
			if !strings.Contains(l, p) {
				continue line
			}
		}
		return true
	}
	return false
}

// TestConsumeBatchClaimMixedBatch: `idem consume --batch-claim` on NATS,
// over Redis, fed one fetch's worth of messages that mix new ones, an ID
// twice, a message completed by an earlier run, one held by another live
// process, one with two different IDs and one with none: each new
// message and the twin are called once; the completed one is acked
// without a call; the held one is not called while the other process
// holds it and is called once after it lets go; the two without a
// single ID are dead-lettered uncalled; everything is acked in the end.
func TestConsumeBatchClaimMixedBatch(t *testing.T) {
	t.Parallel()
	redisURL, prefix, brokerURL, js := batchClaimSetup(t, "MIXED", "mixed.in")
	ctx := context.Background()
	msg := func(ids ...string) *nats.Msg {
		m := nats.NewMsg("mixed.in")
		for _, id := range ids {
			m.Header.Add(jetstream.MsgIDHeader, id)
		}
		m.Data = []byte("p")
		return m
	}

	calls := &callLog{}
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer calls.call(r)()
		w.WriteHeader(http.StatusOK)
	}))
	defer svc.Close()
	count := func(id string) int {
		calls.mu.Lock()
		defer calls.mu.Unlock()
		return calls.calls[id]
	}
	const consumer = "mixed"
	args := []string{"--broker", brokerURL, "--from", "mixed.in", "--to", svc.URL + "/in", "--store", redisURL,
		"--redis-prefix", prefix, "--consumer", consumer, "--group", "mixed", "--dead-letter", "mixed.in.dead",
		"--log-level", "info", "--batch-claim", "--concurrency", "4", "--hold", "16",
		"--retry-base", "50ms", "--retry-max", "100ms"}

	// An earlier run completes done-1.
	publishAgain(t, js, msg("done-1"))
	rctx, cancel := context.WithCancel(ctx)
	stderr, done := startConsume(rctx, args...)
	testenv.Eventually(t, 30*time.Second, "done-1 called", func() bool { return count("done-1") == 1 }, stderr)
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("first run: exit %d\n%s", code, stderr())
	}

	// Another process holds held-1 (its lease renewed) meanwhile.
	ps, err := openProxyStore(ctx, redisURL, "", prefix, true, true)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ps.close() }()
	lc, err := idem.NewLeaseConsumer(ps.store, idem.Config{Name: consumer, Lease: 2 * time.Second, PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	holder, _, err := lc.Acquire(ctx, idem.Message{ID: "held-1", Payload: []byte("p")}, idem.AcquireOptions{})
	if holder == nil {
		t.Fatalf("hold held-1: %v", err)
	}

	var fresh []string
	for i := range 6 {
		id := fmt.Sprintf("new-%d", i)
		fresh = append(fresh, id)
		publishAgain(t, js, msg(id))
	}
	publishAgain(t, js, msg("twin"))
	publishAgain(t, js, msg("done-1"))
	publishAgain(t, js, msg("held-1"))
	publishAgain(t, js, msg("twin"))
	publishAgain(t, js, msg("two-a", "two-b"))
	publishAgain(t, js, msg())

	dead, err := js.CreateOrUpdateConsumer(ctx, "MIXED", jetstream.ConsumerConfig{Durable: "dead", FilterSubject: "mixed.in.dead"})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel = context.WithCancel(ctx)
	defer cancel()
	stderr, done = startConsume(rctx, args...)
	testenv.Eventually(t, 60*time.Second, "the new messages and the twin called, two dead-lettered, held-1 found in progress",
		func() bool {
			for _, id := range append(fresh, "twin") {
				if count(id) == 0 {
					return false
				}
			}
			info, err := dead.Info(ctx)
			return err == nil && info.NumPending == 2 && logged(stderr(), "message_id=held-1", "outcome=InProgress")
		}, stderr)
	if n := count("held-1"); n != 0 {
		t.Fatalf("held-1 called %d times while another process held it", n)
	}
	if out, err := holder.Release(ctx, errors.New("handed back")); out.Poison || errors.Is(err, idem.ErrStore) || errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("release held-1: %v (poison %v)", err, out.Poison)
	}
	testenv.Eventually(t, 60*time.Second, "held-1 called after its holder let go", func() bool { return count("held-1") == 1 }, stderr)
	mixed, err := js.Consumer(ctx, "MIXED", "mixed")
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "every message acked", func() bool {
		info, err := mixed.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	}, stderr)
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr())
	}
	want := map[string]int{"done-1": 1, "held-1": 1, "twin": 1}
	for _, id := range fresh {
		want[id] = 1
	}
	calls.mu.Lock()
	got := fmt.Sprint(calls.calls)
	calls.mu.Unlock()
	if got != fmt.Sprint(want) {
		t.Errorf("calls by ID: %s, want %s (two-a/two-b and the message without an ID never called)\n%s", got, fmt.Sprint(want), stderr())
	}
	if info, err := dead.Info(ctx); err != nil || info.NumPending != 2 {
		t.Errorf("dead letters: %+v, %v; want 2", info, err)
	}
}

// TestConsumeBatchClaimHoldBelowConcurrency: --hold below --concurrency
// is a usage error with --batch-claim too, before anything is opened.
func TestConsumeBatchClaimHoldBelowConcurrency(t *testing.T) {
	t.Parallel()
	code, _, errOut := run(t, "consume", "--broker", "nats://127.0.0.1:1", "--from", "x", "--to", "http://127.0.0.1:1/in",
		"--store", "sqlite:"+t.TempDir()+"/x.db", "--batch-claim", "--concurrency", "4", "--hold", "2")
	if code != 2 || !strings.Contains(errOut, "--hold") {
		t.Fatalf("exit %d, stderr %q; want 2 naming --hold", code, errOut)
	}
}

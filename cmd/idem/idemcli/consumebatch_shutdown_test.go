package idemcli

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testenv"
)

// TestConsumeBatchClaimShutdown stops `idem consume --batch-claim` (its
// context ends, as on SIGTERM) while calls of its batches run. Graceful:
// the calls then answer 200 within --shutdown-timeout; the sidecar exits
// 0 and leaves no message unacked (what it had started is recorded and
// acked, what it held unstarted is handed back). Timed out: the calls
// outlast --shutdown-timeout, so the sidecar cuts them; at most once
// their outcome is unknown, recorded as such (the final writes run on a
// context of their own), and each cut message is dead-lettered and
// acked before the sidecar exits (with an error). A new sidecar then
// delivers the rest: each message called once, the cut ones never again.
// The timed-out stop also without --batch-claim. (How many calls run at
// the stop depends on how the pull request's messages arrive: the test
// counts the calls made rather than expecting all eight.)
func TestConsumeBatchClaimShutdown(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		timeout  string
		graceful bool
		args     []string
	}{
		{"graceful", "30s", true, []string{"--batch-claim"}},
		{"timed-out", "300ms", false, []string{"--batch-claim"}},
		// The same stop without --batch-claim: one delivery at a time.
		{"timed-out-single", "300ms", false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const n = 8
			redisURL, prefix, brokerURL, js := batchClaimSetup(t, "STOP", "stop.in")
			ctx := context.Background()
			for i := range n {
				m := nats.NewMsg("stop.in")
				m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("m-%02d", i))
				m.Data = []byte("p")
				publishAgain(t, js, m)
			}
			calls := &callLog{}
			gate := make(chan struct{}) // closed: every call answers 200
			svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				defer calls.call(r)()
				select {
				case <-gate:
					w.WriteHeader(http.StatusOK)
				case <-r.Context().Done(): // the sidecar cut the call
				}
			}))
			defer svc.Close()
			var opened sync.Once
			open := func() { opened.Do(func() { close(gate) }) }
			defer open()
			running := func() int {
				calls.mu.Lock()
				defer calls.mu.Unlock()
				return calls.running
			}
			args := []string{"--broker", brokerURL, "--from", "stop.in", "--to", svc.URL + "/in", "--store", redisURL,
				"--redis-prefix", prefix, "--consumer", "stop", "--group", "stop", "--dead-letter", "stop.in.dead",
				"--log-level", "warn", "--concurrency", fmt.Sprint(n), "--hold", fmt.Sprint(n),
				"--shutdown-timeout", tc.timeout, "--ack-wait", "2s"}
			args = append(args, tc.args...)
			dead, err := js.CreateOrUpdateConsumer(ctx, "STOP", jetstream.ConsumerConfig{Durable: "dead", FilterSubject: "stop.in.dead"})
			if err != nil {
				t.Fatal(err)
			}
			cons := func() jetstream.ConsumerInfo {
				c, err := js.Consumer(ctx, "STOP", "stop") // the sidecar's
				if err != nil {
					t.Fatal(err)
				}
				ci, err := c.Info(ctx)
				if err != nil {
					t.Fatal(err)
				}
				return *ci
			}
			deadLetters := func() uint64 {
				di, err := dead.Info(ctx)
				if err != nil {
					t.Fatal(err)
				}
				return di.NumPending
			}
			ps, err := openProxyStore(ctx, redisURL, "", prefix, true, true)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = ps.close() }()
			probe, err := idem.NewLeaseConsumer(ps.store, idem.Config{Name: "stop", PurgeInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer probe.Close()

			rctx, cancel := context.WithCancel(ctx)
			stderr, done := startConsume(rctx, args...)
			testenv.Eventually(t, 60*time.Second, "calls running", func() bool { return running() > 0 }, stderr)
			cancel()
			if tc.graceful {
				open()
			}
			code := <-done
			if tc.graceful != (code == 0) {
				t.Fatalf("exit %d (graceful %v)\n%s", code, tc.graceful, stderr())
			}
			// What the stopped sidecar called is recorded (answered, or
			// cut: outcome unknown), acked, and, when cut, dead-lettered;
			// only what it held unstarted may still be delivered.
			var called int
			testenv.Eventually(t, 30*time.Second, "the calls made settled at the stop", func() bool {
				_, called = calls.snapshot()
				want := uint64(0)
				if !tc.graceful {
					want = uint64(called)
				}
				return called > 0 && deadLetters() == want && cons().NumAckPending <= n-called
			}, func() string {
				return fmt.Sprintf("%d called, %d dead letters, %d unacked\n%s", called, deadLetters(), cons().NumAckPending, stderr())
			})
			calls.mu.Lock()
			var ids []string
			for id := range calls.calls {
				ids = append(ids, id)
			}
			calls.mu.Unlock()
			for _, id := range ids {
				if _, out, _ := probe.Acquire(ctx, idem.Message{ID: id, Payload: []byte("p")}, idem.AcquireOptions{}); out.Status != idem.Duplicate {
					t.Errorf("%s, called before the stop: %v, want its record completed", id, out.Status)
				}
			}
			wantDead := deadLetters()

			// A new sidecar delivers what the stopped one handed back
			// (its Nak'ed messages may wait for the ack wait, 2s, when
			// the server handed them to the stopped one's pull request).
			open()
			if ci := cons(); ci.NumPending+uint64(ci.NumAckPending) > 0 {
				rctx, cancel = context.WithCancel(ctx)
				defer cancel()
				stderr, done = startConsume(rctx, args...)
				testenv.Eventually(t, 60*time.Second, "every message settled", func() bool {
					ci := cons()
					return ci.NumPending == 0 && ci.NumAckPending == 0 && deadLetters() == wantDead
				}, stderr)
				cancel()
				if code := <-done; code != 0 {
					t.Fatalf("second run: exit %d\n%s", code, stderr())
				}
			}
			if d, c := calls.snapshot(); d != n || c != n {
				t.Errorf("%d messages called in %d calls; want %d once each", d, c, n)
			}
			t.Logf("%d calls at the stop", called)
		})
	}
}

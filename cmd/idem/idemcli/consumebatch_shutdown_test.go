package idemcli

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem/internal/testenv"
)

// TestConsumeBatchClaimShutdown stops `idem consume --batch-claim` (its
// context ends, as on SIGTERM) while every call of its two batches runs
// (the eight messages of one fetch, shared by its two batch handlers).
// Graceful: the calls then answer 200 within --shutdown-timeout; the
// sidecar exits 0 with every answer recorded and every message acked.
// Timed out: the calls outlast --shutdown-timeout, so the sidecar cuts
// them; at most once their outcome is unknown, recorded as such (the
// final writes run on a context of their own) and every message is
// dead-lettered and acked before the sidecar exits (with an error). In
// both, the same messages published again are settled from their
// records by a new sidecar, without a call: each message called once.
// The timed-out stop also without --batch-claim.
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
			publish := func() {
				for i := range n {
					m := nats.NewMsg("stop.in")
					m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("m-%02d", i))
					m.Data = []byte("p")
					publishAgain(t, js, m)
				}
			}
			calls := &callLog{}
			gate := make(chan struct{})
			svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				defer calls.call(r)()
				select {
				case <-gate:
					w.WriteHeader(http.StatusOK)
				case <-r.Context().Done(): // the sidecar cut the call
				}
			}))
			defer svc.Close()
			defer close(gate)
			running := func() int {
				calls.mu.Lock()
				defer calls.mu.Unlock()
				return calls.running
			}
			args := []string{"--broker", brokerURL, "--from", "stop.in", "--to", svc.URL + "/in", "--store", redisURL,
				"--redis-prefix", prefix, "--consumer", "stop", "--group", "stop", "--dead-letter", "stop.in.dead",
				"--log-level", "warn", "--concurrency", fmt.Sprint(n), "--hold", fmt.Sprint(n),
				"--shutdown-timeout", tc.timeout}
			args = append(args, tc.args...)
			dead, err := js.CreateOrUpdateConsumer(ctx, "STOP", jetstream.ConsumerConfig{Durable: "dead", FilterSubject: "stop.in.dead"})
			if err != nil {
				t.Fatal(err)
			}
			settled := func(what string, deadLetters uint64, stderr func() string) {
				t.Helper()
				cons, err := js.Consumer(ctx, "STOP", "stop") // the sidecar's
				if err != nil {
					t.Fatal(err)
				}
				testenv.Eventually(t, 30*time.Second, what, func() bool {
					ci, err1 := cons.Info(ctx)
					di, err2 := dead.Info(ctx)
					return err1 == nil && err2 == nil && ci.NumPending == 0 && ci.NumAckPending == 0 && di.NumPending == deadLetters
				}, func() string {
					ci, _ := cons.Info(ctx)
					di, _ := dead.Info(ctx)
					return fmt.Sprintf("pending %d, ack pending %d, dead letters %d\n%s", ci.NumPending, ci.NumAckPending, di.NumPending, stderr())
				})
			}

			publish()
			rctx, cancel := context.WithCancel(ctx)
			stderr, done := startConsume(rctx, args...)
			testenv.Eventually(t, 60*time.Second, "every call running", func() bool { return running() == n }, stderr)
			cancel()
			if tc.graceful {
				for range n {
					gate <- struct{}{}
				}
			}
			code := <-done
			if tc.graceful != (code == 0) {
				t.Fatalf("exit %d (graceful %v)\n%s", code, tc.graceful, stderr())
			}
			var deadLetters uint64
			if !tc.graceful {
				deadLetters = n // outcome-unknown
			}
			settled("every message acked at the stop", deadLetters, stderr)

			// The same messages again, to a new sidecar: from the records.
			publish()
			rctx, cancel = context.WithCancel(ctx)
			defer cancel()
			stderr, done = startConsume(rctx, args...)
			if !tc.graceful {
				deadLetters *= 2
			}
			settled("every message settled from its record", deadLetters, stderr)
			cancel()
			if code := <-done; code != 0 {
				t.Fatalf("second run: exit %d\n%s", code, stderr())
			}
			if d, c := calls.snapshot(); d != n || c != n {
				t.Errorf("%d messages called in %d calls; want %d once each", d, c, n)
			}
		})
	}
}

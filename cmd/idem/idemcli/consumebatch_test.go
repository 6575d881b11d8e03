package idemcli

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/idemsql"
)

// TestConsumeBatchClaimBrokers: --batch-claim on a broker other than
// NATS, Redis Streams and Kafka, or with --kafka-order key, is a usage
// error.
func TestConsumeBatchClaimBrokers(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		broker string
		extra  []string
		want   string
	}{
		{"amqp://guest:guest@127.0.0.1:1/", nil, "--batch-claim is for a nats://, redis://"},
		{"kafka://127.0.0.1:1", []string{"--kafka-order", "key"}, "does not take --kafka-order key"},
	} {
		code, _, errOut := run(t, append([]string{"consume", "--broker", tt.broker, "--from", "x", "--to", "http://127.0.0.1:1/in",
			"--store", "sqlite:" + t.TempDir() + "/x.db", "--batch-claim"}, tt.extra...)...)
		if code != 2 || !strings.Contains(errOut, tt.want) {
			t.Errorf("%s %v: exit %d, stderr %q; want 2 and %q", tt.broker, tt.extra, code, errOut, tt.want)
		}
	}
	for broker, want := range map[string]bool{"nats://h:1": true, "tls://h:1": true, "redis://h:1/0": true, "REDISS://h:1/0": true,
		"kafka://h:1": true, "amqp://h:1": false, "mem://x": false} {
		if got := batchClaimBroker(broker); got != want {
			t.Errorf("batchClaimBroker(%q) = %v, want %v", broker, got, want)
		}
	}
}

// TestConsumeBatchClaim: `idem consume --batch-claim --concurrency 3
// --hold 12` on NATS delivers every message once, never more than three
// calls at a time, with a record per message; a message the service
// refuses is dead-lettered, not retried.
func TestConsumeBatchClaim(t *testing.T) {
	t.Parallel()
	const n, concurrency, hold = 40, 3, 12
	brokerURL := "nats://idem:pw@" + startNATS(t, "idem", "pw")
	js := newStream(t, brokerURL, "BATCH", "batch.in", "batch.in.dead")
	ctx := context.Background()
	publishNumbered(t, js, "batch.in", n)

	calls := &callLog{}
	svc := refusingService(t, calls, "m-07")
	snapshot := calls.snapshot

	storePath := filepath.Join(t.TempDir(), "c.db")
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stderr, done := startConsume(rctx, "--broker", brokerURL, "--from", "batch.in", "--to", svc.URL+"/in",
		"--store", "sqlite:"+storePath, "--log-level", "warn", "--batch-claim",
		"--concurrency", fmt.Sprint(concurrency), "--hold", fmt.Sprint(hold))
	sub, err := js.CreateOrUpdateConsumer(ctx, "BATCH", jetstream.ConsumerConfig{Durable: "dead", FilterSubject: "batch.in.dead"})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "every message called, the refused one dead-lettered",
		func() bool {
			d, _ := snapshot()
			info, err := sub.Info(ctx)
			return d == n && err == nil && info.NumPending == 1
		},
		func() string {
			d, c := snapshot()
			return fmt.Sprintf("%d messages called, %d calls\n%s", d, c, stderr())
		})
	stopConsume(t, cancel, done, stderr, calls, n, concurrency)
	wantRecords(t, storePath, n)
}

// refusingService is a test service, closed at cleanup, that logs its
// calls to calls and answers 200, or 422 (a refusal, dead-lettered) to the
// message refused.
func refusingService(t *testing.T, calls *callLog, refused string) *httptest.Server {
	t.Helper()
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer calls.call(r)()
		if r.Header.Get("Idempotency-Key") == refused {
			w.WriteHeader(http.StatusUnprocessableEntity)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(svc.Close)
	return svc
}

// wantRecords checks that the SQLite store at storePath holds n records.
func wantRecords(t *testing.T, storePath string, n int) {
	t.Helper()
	db, err := sql.Open("sqlite", idemsql.SQLiteDSN(storePath))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var k int
	if err := db.QueryRow(`SELECT count(*) FROM idem_processed`).Scan(&k); err != nil || k != n {
		t.Errorf("%d records at the end (%v); want %d", k, err, n)
	}
}

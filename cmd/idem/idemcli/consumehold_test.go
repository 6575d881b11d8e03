package idemcli

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/idemsql"
)

// TestConsumeHoldClaimsAhead: `idem consume --concurrency 2 --hold 10`
// claims the messages it holds as they arrive, while only two calls run:
// with the service holding its first two calls, ten records are in the
// store and the service has had two calls; once it answers, every message
// is delivered once, never more than two calls at a time.
func TestConsumeHoldClaimsAhead(t *testing.T) {
	t.Parallel()
	const n, concurrency, hold = 30, 2, 10
	brokerURL := "nats://idem:pw@" + startNATS(t, "idem", "pw")
	js := newStream(t, brokerURL, "HOLD", "hold.in")
	ctx := context.Background()
	publishNumbered(t, js, "hold.in", n)

	release := make(chan struct{})
	calls := &callLog{}
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer calls.call(r)()
		<-release
		w.WriteHeader(http.StatusOK)
	}))
	defer svc.Close()
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	snapshot := calls.snapshot

	storePath := filepath.Join(t.TempDir(), "c.db")
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stderr, done := startConsume(rctx, "--broker", brokerURL, "--from", "hold.in", "--to", svc.URL+"/in",
		"--store", "sqlite:"+storePath, "--log-level", "warn",
		"--concurrency", fmt.Sprint(concurrency), "--hold", fmt.Sprint(hold))

	db, err := sql.Open("sqlite", idemsql.SQLiteDSN(storePath))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	records := func() int {
		var k int
		if err := db.QueryRow(`SELECT count(*) FROM idem_processed`).Scan(&k); err != nil {
			return -1 // not created yet
		}
		return k
	}
	testenv.Eventually(t, 60*time.Second, fmt.Sprintf("%d records claimed while %d calls run", hold, concurrency),
		func() bool { _, c := snapshot(); return records() == hold && c == concurrency },
		func() string {
			_, c := snapshot()
			return fmt.Sprintf("%d records, %d calls\n%s", records(), c, stderr())
		})
	close(release)
	testenv.Eventually(t, 60*time.Second, "every message delivered", func() bool { d, _ := snapshot(); return d == n },
		func() string {
			d, c := snapshot()
			return fmt.Sprintf("%d messages called, %d calls\n%s", d, c, stderr())
		})
	stopConsume(t, cancel, done, stderr, calls, n, concurrency)
	if k := records(); k != n {
		t.Errorf("%d records at the end; want %d", k, n)
	}
}

// publishNumbered publishes n messages with IDs m-00, m-01, ... and
// payload "p" to subject.
func publishNumbered(t *testing.T, js jetstream.JetStream, subject string, n int) {
	t.Helper()
	for i := range n {
		m := nats.NewMsg(subject)
		m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("m-%02d", i))
		m.Data = []byte("p")
		if _, err := js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
}

// callLog records a test service's calls by Idempotency-Key, and the
// most that ran at once.
type callLog struct {
	mu            sync.Mutex
	calls         map[string]int
	running, most int
}

// call records the start of the call r; the function it returns records
// its end.
func (l *callLog) call(r *http.Request) (end func()) {
	l.mu.Lock()
	if l.calls == nil {
		l.calls = map[string]int{}
	}
	l.calls[r.Header.Get("Idempotency-Key")]++
	l.running++
	l.most = max(l.most, l.running)
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		l.running--
		l.mu.Unlock()
	}
}

// snapshot returns the messages called and the calls so far.
func (l *callLog) snapshot() (distinct, total int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.calls {
		total += c
	}
	return len(l.calls), total
}

// peak is the most calls that ran at once.
func (l *callLog) peak() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.most
}

// startConsume runs `idem consume` with args until ctx ends: stderr
// returns what it wrote so far, done gets its exit code.
func startConsume(ctx context.Context, args ...string) (stderr func() string, done <-chan int) {
	var out, errOut strings.Builder
	ow, ew := &lockedWriter{w: &out}, &lockedWriter{w: &errOut}
	code := make(chan int, 1)
	go func() { code <- mainContext(ctx, append([]string{"consume"}, args...), ow, ew) }()
	return func() string { ew.mu.Lock(); defer ew.mu.Unlock(); return errOut.String() }, code
}

// stopConsume ends the command started by startConsume (cancel), wants
// exit status 0, and each of the n messages called once, never more than
// concurrency calls at a time.
func stopConsume(t *testing.T, cancel context.CancelFunc, done <-chan int, stderr func() string, calls *callLog, n, concurrency int) {
	t.Helper()
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("consume exit %d:\n%s", code, stderr())
	}
	if d, c := calls.snapshot(); d != n || c != n {
		t.Errorf("%d messages called in %d calls; want %d once each", d, c, n)
	}
	if most := calls.peak(); most > concurrency {
		t.Errorf("%d calls ran at once; want at most --concurrency %d", most, concurrency)
	}
}

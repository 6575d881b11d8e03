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
	for i := range n {
		m := nats.NewMsg("hold.in")
		m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("m-%02d", i))
		m.Data = []byte("p")
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}

	release := make(chan struct{})
	var mu sync.Mutex
	calls := map[string]int{}
	running, most := 0, 0
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls[r.Header.Get("Idempotency-Key")]++
		running++
		most = max(most, running)
		mu.Unlock()
		<-release
		mu.Lock()
		running--
		mu.Unlock()
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
	snapshot := func() (distinct, total int) {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range calls {
			total += c
		}
		return len(calls), total
	}

	storePath := filepath.Join(t.TempDir(), "c.db")
	var out, errOut strings.Builder
	ow, ew := &lockedWriter{w: &out}, &lockedWriter{w: &errOut}
	stderr := func() string { ew.mu.Lock(); defer ew.mu.Unlock(); return errOut.String() }
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- mainContext(rctx, []string{"consume", "--broker", brokerURL, "--from", "hold.in", "--to", svc.URL + "/in",
			"--store", "sqlite:" + storePath, "--log-level", "warn",
			"--concurrency", fmt.Sprint(concurrency), "--hold", fmt.Sprint(hold)}, ow, ew)
	}()

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
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("consume exit %d:\n%s", code, stderr())
	}
	if d, c := snapshot(); d != n || c != n {
		t.Errorf("%d messages called in %d calls; want %d once each", d, c, n)
	}
	if most > concurrency {
		t.Errorf("%d calls ran at once; want at most --concurrency %d", most, concurrency)
	}
	if k := records(); k != n {
		t.Errorf("%d records at the end; want %d", k, n)
	}
}

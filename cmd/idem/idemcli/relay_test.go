package idemcli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/internal/testenv"
)

// TestRelayToRedisStreams runs `idem relay` on a SQLite store with two rows
// written into the outbox table by another program: both reach the stream,
// with their IDs in the message-id field and their headers as fields, and
// are marked sent; the command returns nil when its context ends.
func TestRelayToRedisStreams(t *testing.T) {
	url := serviceURL(t, "IDEM_TEST_REDIS_URL")
	storeURL, st := migratedSQLite(t)
	rl := newRelayRun(t, url, st, "idem_processed")
	rl.insert(1)
	rl.insert(2)
	stderr := rl.start("--store", storeURL)
	rl.awaitSent(2, stderr)
}

// TestRelayListensOnPostgres runs `idem relay` on PostgreSQL with polls
// ten minutes apart: a row written by another program after the relay
// started and went idle reaches the stream within the test only because
// the relay LISTENs (pgx) and the outbox trigger NOTIFYs. Its Prometheus
// metrics count the messages sent.
func TestRelayListensOnPostgres(t *testing.T) {
	t.Parallel()
	url := serviceURL(t, "IDEM_TEST_REDIS_URL")
	pg := serviceURL(t, "IDEM_TEST_POSTGRES_URL")
	table, st := migratedPG(t, pg)
	metricsAddr := "127.0.0.1:" + strconv.Itoa(freePorts(t, 1)[0])
	rl := newRelayRun(t, url, st, table)
	stderr := rl.start("--store", pg, "--table", table, "--min-poll", "10m", "--max-poll", "10m", "--metrics-addr", metricsAddr)
	testenv.Eventually(t, 60*time.Second, "the relay to start listening", func() bool {
		return strings.Contains(stderr(), "(LISTEN/NOTIFY)")
	}, stderr)
	// The first row may go out in the relay's first round or on the
	// notification; once it is out the first round is over, and with
	// polls 10 minutes apart only a notification sends the second.
	rl.insert(1)
	rl.awaitSent(1, stderr)
	rl.insert(2)
	rl.awaitSent(2, stderr)

	sent := regexp.MustCompile(`(?m)^idem_outbox_sent_total\{[^}]*messaging_system="redis"[^}]*\} (\d+)`)
	var body string
	testenv.Eventually(t, 30*time.Second, "idem_outbox_sent_total 2 on /metrics", func() bool {
		resp, err := http.Get("http://" + metricsAddr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		m := sent.FindStringSubmatch(body)
		return m != nil && m[1] == "2" && strings.Contains(body, "idem_outbox_pending")
	}, func() string { return body })
}

// TestRelayThroughPgBouncer runs `idem relay` with PostgreSQL behind
// PgBouncer in transaction pooling as the store: the pooler refuses the
// command's session settings, so the relay connects without them and
// polls (a LISTEN through a transaction pooler is heard by nobody); rows
// written by another program reach the stream. It used to open a pool of
// its own with those settings, and every claim failed with "unsupported
// startup parameter" while the command ran on, sending nothing.
func TestRelayThroughPgBouncer(t *testing.T) {
	t.Parallel()
	url := serviceURL(t, "IDEM_TEST_REDIS_URL")
	bouncer := serviceURL(t, "IDEM_TEST_PGBOUNCER_URL")
	table, st := migratedPG(t, bouncer)
	rl := newRelayRun(t, url, st, table)
	rl.insert(1)
	rl.insert(2)
	stderr := rl.start("--store", bouncer, "--table", table, "--min-poll", "10ms", "--max-poll", "50ms")
	rl.awaitSent(2, stderr)
	if !strings.Contains(stderr(), "no LISTEN through a pooler") {
		t.Errorf("the relay does not say it polls through the pooler:\n%s", stderr())
	}
}

// migratedPG migrates a table of its own on the PostgreSQL of storeURL
// (`idem migrate`), and returns its name and the store open on it; both
// are dropped, with the outbox's trigger function and domains, when the
// test ends.
func migratedPG(t *testing.T, storeURL string) (string, *sqlStore) {
	t.Helper()
	table := "idem_relay_" + randSuffix()
	if code, _, stderr := run(t, "migrate", "--store", storeURL, "--table", table); code != 0 {
		t.Fatalf("migrate: exit %d: %s", code, stderr)
	}
	st, err := openSQLStore(t.Context(), storeURL, table)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.db.Close() })
	t.Cleanup(func() {
		for _, tb := range []string{table + "_steps", table, table + "_migrations", table + "_runs", table + "_outbox"} {
			_, _ = st.db.Exec("DROP TABLE IF EXISTS " + tb)
		}
		_, _ = st.db.Exec("DROP FUNCTION IF EXISTS " + table + "_outbox_notify()")
		_, _ = st.db.Exec("DROP DOMAIN IF EXISTS " + table + "_outbox_id, " + table + "_outbox_str")
	})
	return table, st
}

// relayRun is one `idem relay` under test: the store's outbox table,
// written as another program would, and the Redis stream it relays to.
type relayRun struct {
	t      *testing.T
	url    string
	st     *sqlStore
	table  string
	stream string
	rdb    *redis.Client
}

func newRelayRun(t *testing.T, url string, st *sqlStore, table string) *relayRun {
	opts, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	rl := &relayRun{t: t, url: url, st: st, table: table, stream: fmt.Sprintf("idem-test-relay-%d", time.Now().UnixNano()), rdb: redis.NewClient(opts)}
	t.Cleanup(func() { rl.rdb.Del(context.Background(), rl.stream); rl.rdb.Close() })
	return rl
}

// insert writes row i (ID order-i-created, payload pi) into the outbox.
func (rl *relayRun) insert(i int) {
	rl.t.Helper()
	q := `INSERT INTO ` + rl.table + `_outbox (id, destination, order_key, payload, headers) VALUES (?, ?, 'k', ?, '{"trace":"t1"}')`
	if _, err := rl.st.db.Exec(rebind(rl.st.dialect, q), fmt.Sprintf("order-%d-created", i), rl.stream, []byte(fmt.Sprintf("p%d", i))); err != nil {
		rl.t.Fatalf("insert: %v", err)
	}
}

// start runs `idem relay --broker URL args...` until the test ends, and
// returns its stderr; the command must return nil when its context ends.
func (rl *relayRun) start(args ...string) (stderr func() string) {
	ctx, cancel := context.WithCancel(context.Background())
	var out, errOut strings.Builder
	lw := &lockedWriter{w: &errOut}
	root := newRoot(&out, lw)
	root.SetArgs(append([]string{"relay", "--broker", rl.url}, args...))
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	stderr = func() string {
		lw.mu.Lock()
		defer lw.mu.Unlock()
		return errOut.String()
	}
	rl.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			rl.t.Errorf("idem relay: %v (stderr %s)", err, stderr())
		}
	})
	return stderr
}

// awaitSent waits until rows 1..n are in the stream, in order, with their
// IDs, headers and payloads, and none is left unsent.
func (rl *relayRun) awaitSent(n int, stderr func() string) {
	rl.t.Helper()
	var entries []redis.XMessage
	var err error
	testenv.Eventually(rl.t, 60*time.Second, fmt.Sprintf("%d rows in the stream and marked sent", n), func() bool {
		entries, err = rl.rdb.XRange(context.Background(), rl.stream, "-", "+").Result()
		var unsent int
		_ = rl.st.db.QueryRow(`SELECT COUNT(*) FROM ` + rl.table + `_outbox WHERE sent_at IS NULL`).Scan(&unsent)
		return err == nil && len(entries) == n && unsent == 0
	}, func() string { return fmt.Sprintf("%d entries (%v); stderr %s", len(entries), err, stderr()) })
	for i, e := range entries {
		if e.Values["message-id"] != fmt.Sprintf("order-%d-created", i+1) || e.Values["trace"] != "t1" || e.Values["payload"] != fmt.Sprintf("p%d", i+1) {
			rl.t.Errorf("entry %d: %v", i, e.Values)
		}
	}
}

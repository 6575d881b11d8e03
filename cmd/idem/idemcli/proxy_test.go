package idemcli

import (
	"bufio"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
)

// proxyRun is `idem proxy` running in process.
type proxyRun struct {
	addr   string // http://host:port
	cancel context.CancelFunc
	done   chan error
	lines  chan string // stdout lines after the first
	stderr func() string
}

// startProxy runs `idem proxy` with args until the test ends (or stop),
// and waits for its listening line.
func startProxy(t *testing.T, args ...string) *proxyRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	var errOut strings.Builder
	ew := &lockedWriter{w: &errOut}
	root := newRoot(pw, ew)
	root.SetArgs(append([]string{"proxy", "--listen", "127.0.0.1:0"}, args...))
	run := &proxyRun{cancel: cancel, done: make(chan error, 1), lines: make(chan string, 16), stderr: func() string {
		ew.mu.Lock()
		defer ew.mu.Unlock()
		return errOut.String()
	}}
	go func() {
		err := root.ExecuteContext(ctx)
		pw.Close()
		run.done <- err
	}()
	first := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		n := 0
		for sc.Scan() {
			if n == 0 {
				first <- sc.Text()
			} else {
				run.lines <- sc.Text()
			}
			n++
		}
		close(first)
		close(run.lines)
	}()
	t.Cleanup(func() {
		cancel()
		<-run.done
	})
	select {
	case line, ok := <-first:
		m := regexp.MustCompile(`listening on (http://\S+),`).FindStringSubmatch(line)
		if !ok || m == nil {
			cancel()
			err := <-run.done
			run.done <- err
			ew.mu.Lock()
			defer ew.mu.Unlock()
			t.Fatalf("no listening line (got %q); err %v, stderr: %s", line, err, errOut.String())
		}
		run.addr = m[1]
	case <-time.After(60 * time.Second):
		t.Fatal("idem proxy did not start in 60 s")
	}
	return run
}

// stop sends the shutdown signal and returns the command's error.
func (p *proxyRun) stop(t *testing.T) error {
	p.cancel()
	select {
	case err := <-p.done:
		p.done <- err // for the cleanup
		return err
	case <-time.After(60 * time.Second):
		t.Fatal("idem proxy did not stop in 60 s")
		return nil
	}
}

// lockedWriter serialises writes (the command's logger and server write
// from several goroutines).
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

func randSuffix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// proxyStoreURLs are the stores `idem proxy` is tested on, each with the
// extra flags that isolate the test (a table or a Redis prefix) and a
// cleanup.
func proxyStoreURLs(t *testing.T) map[string][]string {
	table := "idem_px_" + randSuffix()
	out := map[string][]string{"sqlite": {"--store", "sqlite:" + t.TempDir() + "/proxy.db"}}
	drop := func(driver, dsn string) {
		t.Cleanup(func() {
			db, err := sql.Open(driver, dsn)
			if err != nil {
				return
			}
			defer db.Close()
			for _, tb := range []string{table, table + "_steps", table + "_migrations"} {
				_, _ = db.Exec("DROP TABLE IF EXISTS " + tb)
			}
		})
	}
	if u := optionalURL(t, "IDEM_TEST_POSTGRES_URL"); u != "" {
		out["postgres"] = []string{"--store", u, "--table", table}
		drop("pgx", u)
	}
	if dsn := optionalURL(t, "IDEM_TEST_MYSQL_URL"); dsn != "" {
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Fatalf("IDEM_TEST_MYSQL_URL: %v", err)
		}
		out["mariadb"] = []string{"--store", fmt.Sprintf("mysql://%s:%s@%s/%s", cfg.User, cfg.Passwd, cfg.Addr, cfg.DBName), "--table", table}
		drop("mysql", dsn)
	}
	if u := optionalURL(t, "IDEM_TEST_REDIS_URL"); u != "" {
		prefix := "idem-px-test:" + randSuffix() + ":"
		out["redis"] = []string{"--store", u, "--redis-prefix", prefix}
		t.Cleanup(func() {
			opts, err := redis.ParseURL(u)
			if err != nil {
				return
			}
			c := redis.NewClient(opts)
			defer c.Close()
			ctx := context.Background()
			iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
			for iter.Next(ctx) {
				c.Del(ctx, iter.Val())
			}
		})
	}
	return out
}

func TestProxyCommand(t *testing.T) {
	t.Parallel()
	for name, storeArgs := range proxyStoreURLs(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testProxyCommand(t, storeArgs)
		})
	}
}

func testProxyCommand(t *testing.T, storeArgs []string) {
	var n atomic.Int64
	gate := make(chan struct{})
	entered := make(chan struct{}, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		id := n.Add(1)
		if r.URL.Path == "/slow" {
			entered <- struct{}{}
			<-gate
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d,"key":%q}`, id, r.Header.Get("Idempotency-Key"))
	}))
	defer up.Close()
	p := startProxy(t, append([]string{"--upstream", up.URL}, storeArgs...)...)
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()

	post := func(path, key string) (int, string, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, p.addr+path, strings.NewReader(`{"amount":100}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer alice")
		req.Header.Set("Idempotency-Key", key)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), string(b)
	}
	s1, r1, b1 := post("/payments", `"pay-1"`)
	s2, r2, b2 := post("/payments", `"pay-1"`)
	if s1 != 201 || r1 != "" || s2 != 201 || r2 != "true" || b1 != b2 || n.Load() != 1 {
		t.Fatalf("first %d %q %s, retry %d %q %s, upstream ran %d; want one run and a replay", s1, r1, b1, s2, r2, b2, n.Load())
	}
	if want := `"key":"\"pay-1\""`; !strings.Contains(b1, want) {
		t.Fatalf("upstream body %s: the key was not forwarded", b1)
	}

	resp, err := client.Get(p.addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	hb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(hb), `"ok"`) || n.Load() != 1 {
		t.Fatalf("healthz: %d %s", resp.StatusCode, hb)
	}

	// Graceful shutdown: a request in flight when the signal comes is
	// finished and recorded; the command then returns nil.
	slow := make(chan string, 1)
	go func() {
		s, _, b := post("/slow", `"pay-2"`)
		slow <- fmt.Sprint(s, " ", b)
	}()
	<-entered
	stopped := make(chan error, 1)
	go func() { stopped <- p.stop(t) }()
	// Shutdown has begun once the listener refuses connections.
	host := strings.TrimPrefix(p.addr, "http://")
	for deadline := time.Now().Add(30 * time.Second); ; {
		c, err := net.DialTimeout("tcp", host, time.Second)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("the listener still accepts connections 30 s after the shutdown signal")
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(gate)
	if got := <-slow; !strings.HasPrefix(got, "201 ") {
		t.Fatalf("request in flight at shutdown: %s, want 201", got)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("idem proxy after shutdown: %v", err)
	}
	if line := <-p.lines; line != "idem proxy: stopped" {
		t.Fatalf("last line %q", line)
	}

	// A second run on the same store replays what the first recorded.
	p2 := startProxy(t, append([]string{"--upstream", up.URL}, storeArgs...)...)
	p.addr = p2.addr
	s3, r3, b3 := post("/slow", `"pay-2"`)
	if s3 != 201 || r3 != "true" || n.Load() != 2 || !strings.Contains(b3, `"id":2`) {
		t.Fatalf("after restart: %d %q %s, upstream ran %d; want the replay of id 2", s3, r3, b3, n.Load())
	}
}

func TestProxyCommandUsage(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"proxy", "--store", "sqlite:/tmp/x.db"}, "--upstream is required"},
		{[]string{"proxy", "--upstream", "http://127.0.0.1:1"}, "--store is required"},
		{[]string{"proxy", "--upstream", "ftp://h", "--store", "sqlite:/tmp/x.db"}, "want an absolute http"},
		{[]string{"proxy", "--upstream", "http://h", "--store", "sqlite:/tmp/x.db", "--listen", "nonsense"}, "--listen"},
		{[]string{"proxy", "--upstream", "http://h", "--store", "sqlite:/tmp/x.db", "--unscoped", "maybe"}, "--unscoped"},
	} {
		code, _, errOut := run(t, tt.args...)
		if code != 2 || !strings.Contains(errOut, tt.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tt.args, code, errOut, tt.want)
		}
	}
	code, _, errOut := run(t, "proxy", "--upstream", "http://h", "--store", "nosuch://x")
	if code != 1 || !strings.Contains(errOut, "unknown scheme") {
		t.Errorf("bad store: exit %d, %q", code, errOut)
	}
}

// Package interop holds end-to-end tests of the idem binary and real
// clients: the `idem proxy` process killed mid-request on each store, a
// store connection cut when the final write is sent, and stripe-go and
// Python urllib3 retrying through the proxy; `idem consume` SIGKILLed
// while it delivers messages to a Python service, on each broker. Every
// test counts how many times the upstream ran each key.
package interop

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// idemBin is the idem binary built by TestMain.
var idemBin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "idem-interop-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Dir(filepath.Dir(file))
	idemBin = filepath.Join(dir, "idem")
	build := exec.Command("go", "build", "-o", idemBin, "./cmd/idem")
	build.Dir = root
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "interop: go build ./cmd/idem:", err)
		return 1
	}
	return m.Run()
}

// uniq returns a short random hex string for table names, prefixes, keys.
func uniq() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// upstream is a test service behind the proxy. It counts, per
// Idempotency-Key, the requests it received and the executions (requests
// it answered with 2xx). Its behaviour for a key's first request is set
// by first.
type upstream struct {
	*httptest.Server
	mu       sync.Mutex
	requests map[string]int
	execs    map[string]int
	arrived  chan string // a key's first request, as it arrives (buffered)

	// first decides how a key's first request is answered: block until
	// the returned channel closes (nil: at once), then answer status
	// (0: 201). Later requests are answered 201 at once.
	first func(key string) (wait <-chan struct{}, status int)
	// beforeAnswer, if set, runs just before a 2xx answer is written.
	beforeAnswer func(key string)
	// body makes the 2xx body of an execution; default {"key":..., "n":...}.
	body func(r *http.Request, key string, n int) (contentType string, b []byte)
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{requests: map[string]int{}, execs: map[string]int{}, arrived: make(chan string, 64)}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	reqBody, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(reqBody))
	u.mu.Lock()
	u.requests[key]++
	n := u.requests[key]
	u.mu.Unlock()
	status := http.StatusCreated
	if n == 1 {
		select {
		case u.arrived <- key:
		default:
		}
		if u.first != nil {
			var wait <-chan struct{}
			if wait, status = u.first(key); wait != nil {
				<-wait
			}
			if status == 0 {
				status = http.StatusCreated
			}
		}
	}
	if status >= 300 {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(status)
		fmt.Fprintf(w, "upstream says %d\n", status)
		return
	}
	u.mu.Lock()
	u.execs[key]++
	e := u.execs[key]
	u.mu.Unlock()
	ct, b := "application/json", []byte(fmt.Sprintf(`{"key":%q,"execution":%d,"body":%q}`, key, e, reqBody))
	if u.body != nil {
		ct, b = u.body(r, key, e)
	}
	if u.beforeAnswer != nil {
		u.beforeAnswer(key)
	}
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(status)
	w.Write(b)
}

// counts returns the upstream's requests and executions of key.
func (u *upstream) counts(key string) (requests, execs int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.requests[key], u.execs[key]
}

// waitArrived waits for the first request of key to reach the upstream.
func (u *upstream) waitArrived(t *testing.T, key string) {
	t.Helper()
	timer := time.NewTimer(20 * time.Second)
	defer timer.Stop()
	for {
		select {
		case k := <-u.arrived:
			if k == key {
				return
			}
		case <-timer.C:
			t.Fatalf("request with key %q never reached the upstream", key)
		}
	}
}

// proxyProc is a running `idem proxy` process.
type proxyProc struct {
	cmd    *exec.Cmd
	URL    string
	done   chan struct{}
	stderr *strings.Builder
	mu     *sync.Mutex
}

// startProxy starts `idem proxy --listen 127.0.0.1:0` with args and waits
// for it to listen. The process is killed at cleanup.
func startProxy(t *testing.T, args ...string) *proxyProc {
	t.Helper()
	cmd := exec.Command(idemBin, append([]string{"proxy", "--listen", "127.0.0.1:0"}, args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &proxyProc{cmd: cmd, done: make(chan struct{}), stderr: &strings.Builder{}, mu: &sync.Mutex{}}
	cmd.Stderr = lockedWriter{p.mu, p.stderr}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("idem proxy stderr:\n%s", p.Stderr())
		}
	})
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			if _, rest, ok := strings.Cut(line, "listening on "); ok {
				a, _, _ := strings.Cut(rest, ",")
				addr <- a
			}
		}
	}()
	select {
	case a := <-addr:
		p.URL = a
	case <-p.done:
		t.Fatalf("idem proxy %v exited before listening: %s", args, p.Stderr())
	case <-time.After(30 * time.Second):
		t.Fatalf("idem proxy %v did not listen within 30s: %s", args, p.Stderr())
	}
	return p
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// Stderr returns what the process wrote to stderr so far.
func (p *proxyProc) Stderr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

// Kill sends SIGKILL and waits for the process to be gone.
func (p *proxyProc) Kill() {
	p.cmd.Process.Kill()
	<-p.done
}

// answer is a response read in full.
type answer struct {
	status int
	header http.Header
	body   []byte
	err    error
}

// problemType returns the "type" member of a problem+json body ("" if none).
func (a answer) problemType() string {
	var p struct {
		Type string `json:"type"`
	}
	json.Unmarshal(a.body, &p)
	return p.Type
}

func (a answer) String() string {
	if a.err != nil {
		return "error: " + a.err.Error()
	}
	return fmt.Sprintf("%d %s (replayed=%q)", a.status, strings.TrimSpace(string(a.body)), a.header.Get("Idempotent-Replayed"))
}

// post sends a keyed POST to base+"/things", scoped by a fixed
// Authorization header.
func post(ctx context.Context, c *http.Client, base, key, body string) answer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/things", strings.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Authorization", "Bearer interop")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := c.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: b, err: err}
}

// postUntilFinal retries a keyed POST while the proxy answers 409
// (request in progress) or 503, or the connection fails, for up to
// timeout; it returns the first other answer.
func postUntilFinal(t *testing.T, base, key, body string, timeout time.Duration) answer {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	deadline := time.Now().Add(timeout)
	var a answer
	for time.Now().Before(deadline) {
		a = post(context.Background(), c, base, key, body)
		if a.err == nil && a.status != http.StatusConflict && a.status != http.StatusServiceUnavailable {
			return a
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("key %q: no final answer within %v; last: %v", key, timeout, a)
	return a
}

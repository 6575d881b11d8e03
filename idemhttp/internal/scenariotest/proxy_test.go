package scenariotest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemhttp"
)

// upstream is the test service behind a proxy: H of the scenarios. It
// counts every request and answers with behave, 201 {"id":n} with
// Location /x/n by default.
type upstream struct {
	*httptest.Server
	n      atomic.Int64
	mu     sync.Mutex
	behave func(n int64, w http.ResponseWriter, r *http.Request)
	keys   []string
}

func newUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	n := u.n.Add(1)
	u.mu.Lock()
	u.keys = append(u.keys, r.Header.Get(idemhttp.HeaderIdempotencyKey))
	b := u.behave
	u.mu.Unlock()
	if b != nil {
		b(n, w, r)
		return
	}
	writeCreated(n, w)
}

func writeCreated(n int64, w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/x/%d", n))
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%d}`, n)
}

func (u *upstream) set(b func(n int64, w http.ResponseWriter, r *http.Request)) {
	u.mu.Lock()
	u.behave = b
	u.mu.Unlock()
}

func (u *upstream) seenKeys() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.keys...)
}

// pxFront is one proxy instance served over HTTP.
type pxFront struct {
	proxy  *idemhttp.Proxy
	srv    *httptest.Server
	client *http.Client
}

// testNamespaceSeq makes each proxy group's namespace unique, so tests
// sharing a store never see each other's keys.
var testNamespaceSeq atomic.Int64

// newProxies starts n proxy instances in front of up, sharing store's
// records: the first on env.store, the others on env.second (another
// connection pool or client, as a second process has).
func newProxies(t *testing.T, env testStoreEnv, target string, n int, o *idemhttp.ProxyOptions) []*pxFront {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	var opts idemhttp.ProxyOptions
	if o != nil {
		opts = *o
	}
	if opts.Options.Namespace == "" {
		opts.Options.Namespace = fmt.Sprintf("px-test-%d", testNamespaceSeq.Add(1))
	}
	if opts.Options.PurgeInterval == 0 {
		opts.Options.PurgeInterval = -1
	}
	if opts.Options.Logger == nil {
		opts.Options.Logger = scQuietLogger()
	}
	var fronts []*pxFront
	for i := range n {
		st := env.store
		if i > 0 {
			st = env.second
		}
		p, err := idemhttp.NewProxy(u, st, &opts)
		if err != nil {
			t.Fatalf("NewProxy: %v", err)
		}
		t.Cleanup(func() { p.Close() })
		srv := httptest.NewServer(p)
		t.Cleanup(srv.Close)
		tr := &http.Transport{MaxIdleConnsPerHost: 64}
		t.Cleanup(tr.CloseIdleConnections)
		fronts = append(fronts, &pxFront{proxy: p, srv: srv, client: &http.Client{Transport: tr}})
	}
	return fronts
}

// pxResp is a response read to its end.
type pxResp struct {
	status int
	header http.Header
	body   string
}

func (r pxResp) replayed() bool { return r.header.Get(idemhttp.HeaderReplayed) == "true" }

// problemType returns the problem type of a problem response, or "".
func (r pxResp) problemType() string {
	if !strings.HasPrefix(r.header.Get("Content-Type"), "application/problem+json") {
		return ""
	}
	var p struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal([]byte(r.body), &p)
	return p.Type
}

// do sends one request through f and reads the response.
func (f *pxFront) do(t testing.TB, ctx context.Context, method, path, key, user, body string) (pxResp, error) {
	req, err := http.NewRequestWithContext(ctx, method, f.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(idemhttp.HeaderIdempotencyKey, key)
	}
	if user != "" {
		req.Header.Set("Authorization", "Bearer "+user)
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return pxResp{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return pxResp{}, err
	}
	return pxResp{status: resp.StatusCode, header: resp.Header, body: string(b)}, nil
}

func (f *pxFront) post(t testing.TB, key, body string) pxResp {
	t.Helper()
	r, err := f.do(t, context.Background(), http.MethodPost, "/x", key, "alice", body)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	return r
}

// storeName is the store of a forEachStore subtest.
func storeName(t *testing.T) string {
	return t.Name()[strings.LastIndex(t.Name(), "/")+1:]
}

// forEachStore runs fn on every store as a parallel subtest.
func forEachStore(t *testing.T, fn func(t *testing.T, env testStoreEnv)) {
	for _, s := range testStores {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			fn(t, s.open(t))
		})
	}
}

func wantStatus(t testing.TB, r pxResp, status int, replayed bool) {
	t.Helper()
	if r.status != status || r.replayed() != replayed {
		t.Fatalf("got %d (replayed %v) %s; want %d (replayed %v)", r.status, r.replayed(), r.body, status, replayed)
	}
}

// TestProxyBasicReplay is A1/B1/I7 through the proxy: one execution, a
// byte-identical replay that never reaches the upstream, and the key
// forwarded unchanged.
func TestProxyBasicReplay(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, env testStoreEnv) {
		up := newUpstream(t)
		f := newProxies(t, env, up.URL, 1, nil)[0]
		const key = `"8e03978e-40d5-43e8-bc93-6894a57f9324"`
		first := f.post(t, key, `{"a":1}`)
		wantStatus(t, first, 201, false)
		for range 3 {
			r := f.post(t, key, `{"a":1}`)
			wantStatus(t, r, 201, true)
			if r.body != first.body || r.header.Get("Location") != "/x/1" || r.header.Get("Content-Type") != "application/json" ||
				r.header.Get("Content-Length") != fmt.Sprint(len(first.body)) {
				t.Fatalf("replay %q %v differs from %q %v", r.body, r.header, first.body, first.header)
			}
		}
		if n := up.n.Load(); n != 1 {
			t.Fatalf("upstream ran %d times, want 1", n)
		}
		if keys := up.seenKeys(); len(keys) != 1 || keys[0] != key {
			t.Fatalf("upstream saw keys %q, want [%s]", keys, key)
		}
		// GET passes through every time, key or not (A9).
		for range 2 {
			r, err := f.do(t, context.Background(), http.MethodGet, "/x", key, "alice", "")
			if err != nil || r.status != 201 || r.replayed() {
				t.Fatalf("GET: %v %+v", err, r)
			}
		}
		if n := up.n.Load(); n != 3 {
			t.Fatalf("upstream ran %d times after two GETs, want 3", n)
		}
	})
}

// TestProxyI1DialFailureReleases: the upstream port is closed: 502
// upstream-unavailable, the key released; once the upstream is up the
// retry runs (n=1).
func TestProxyI1DialFailureReleases(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, env testStoreEnv) {
		// A loopback address no other test listens on (httptest servers
		// use 127.0.0.1): the closed port cannot be taken meanwhile by
		// another parallel test's server, which would answer 201.
		l, err := net.Listen("tcp", "127.0.0.7:0")
		if err != nil {
			l, err = net.Listen("tcp", "127.0.0.1:0")
		}
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		f := newProxies(t, env, "http://"+addr, 1, nil)[0]
		// A proxy that stores upstream 5xx still releases a dial failure.
		store5xx := &idemhttp.ProxyOptions{Options: idemhttp.Options{ReleaseStatus: func(s int) bool { return s == 408 || s == 429 }}}
		f5 := newProxies(t, env, "http://"+addr, 1, store5xx)[0]
		for _, px := range []*pxFront{f, f5} {
			r := px.post(t, `"k1"`, `{"a":1}`)
			if r.status != http.StatusBadGateway || r.problemType() != idemhttp.ProblemUpstreamUnavailable ||
				r.header.Get("Retry-After") == "" || r.header.Get("Cache-Control") != "no-store" {
				t.Fatalf("dial failure: %d %v %s; want 502 upstream-unavailable with Retry-After", r.status, r.header, r.body)
			}
			if strings.Contains(string(r.body), addr) {
				t.Errorf("the 502 shows the upstream's address %s to the client: %s", addr, r.body)
			}
		}
		// The upstream comes up on the same address.
		var l2 net.Listener
		for i := 0; ; i++ {
			l2, err = net.Listen("tcp", addr)
			if err == nil {
				break
			}
			if i == 50 {
				t.Skipf("port %s taken by another process meanwhile: %v", addr, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		up := &upstream{}
		srv := &httptest.Server{Listener: l2, Config: &http.Server{Handler: http.HandlerFunc(up.serve)}}
		srv.Start()
		t.Cleanup(srv.Close)
		for _, px := range []*pxFront{f, f5} {
			wantStatus(t, px.post(t, `"k1"`, `{"a":1}`), 201, false)
			wantStatus(t, px.post(t, `"k1"`, `{"a":1}`), 201, true)
		}
		if n := up.n.Load(); n != 2 {
			t.Fatalf("upstream ran %d times, want 2 (once per proxy)", n)
		}
	})
}

// TestProxyUpstreamTimeoutIsUnknown: the upstream got the request and did
// not answer within UpstreamTimeout: the outcome is unknown and stored.
func TestProxyUpstreamTimeoutIsUnknown(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, env testStoreEnv) {
		up := newUpstream(t)
		release := make(chan struct{})
		t.Cleanup(func() { close(release) })
		up.set(func(n int64, w http.ResponseWriter, r *http.Request) {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		})
		f := newProxies(t, env, up.URL, 1, &idemhttp.ProxyOptions{UpstreamTimeout: 500 * time.Millisecond})[0]
		r := f.post(t, `"k1"`, `{}`)
		if r.status != 502 || r.problemType() != idemhttp.ProblemUpstreamOutcomeUnknown {
			t.Fatalf("timeout: %d %s; want 502 upstream-outcome-unknown", r.status, r.body)
		}
		wantStatus(t, f.post(t, `"k1"`, `{}`), 502, true)
		if n := up.n.Load(); n != 1 {
			t.Fatalf("upstream ran %d times, want 1", n)
		}
	})
}

// TestProxyI3Upstream500: released by default (the retry is forwarded);
// with the store-5xx policy stored and replayed.
func TestProxyI3Upstream500(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, env testStoreEnv) {
		fail := func(_ int64, w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(500)
			io.WriteString(w, "boom")
		}
		up := newUpstream(t)
		up.set(fail)
		f := newProxies(t, env, up.URL, 1, nil)[0]
		wantStatus(t, f.post(t, `"k1"`, `{}`), 500, false)
		wantStatus(t, f.post(t, `"k1"`, `{}`), 500, false)
		if n := up.n.Load(); n != 2 {
			t.Fatalf("release policy: upstream ran %d times, want 2", n)
		}

		up2 := newUpstream(t)
		up2.set(fail)
		store5xx := &idemhttp.ProxyOptions{Options: idemhttp.Options{ReleaseStatus: func(s int) bool { return s == 408 || s == 429 }}}
		f2 := newProxies(t, env, up2.URL, 1, store5xx)[0]
		wantStatus(t, f2.post(t, `"k1"`, `{}`), 500, false)
		r := f2.post(t, `"k1"`, `{}`)
		wantStatus(t, r, 500, true)
		if r.body != "boom" || up2.n.Load() != 1 {
			t.Fatalf("store-5xx policy: replay %q, upstream ran %d times; want \"boom\" and 1", r.body, up2.n.Load())
		}
	})
}

// TestProxyI4Upstream503ReleaseOn503: with 5xx stored but 503 released,
// a 503 + Retry-After is passed on and not stored.
func TestProxyI4Upstream503ReleaseOn503(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, env testStoreEnv) {
		up := newUpstream(t)
		up.set(func(n int64, w http.ResponseWriter, _ *http.Request) {
			if n == 1 {
				w.Header().Set("Retry-After", "2")
				w.WriteHeader(503)
				return
			}
			writeCreated(n, w)
		})
		o := &idemhttp.ProxyOptions{Options: idemhttp.Options{ReleaseStatus: func(s int) bool { return s == 503 || s == 408 || s == 429 }}}
		f := newProxies(t, env, up.URL, 1, o)[0]
		r := f.post(t, `"k1"`, `{}`)
		wantStatus(t, r, 503, false)
		if r.header.Get("Retry-After") != "2" {
			t.Fatalf("Retry-After %q, want the upstream's 2", r.header.Get("Retry-After"))
		}
		wantStatus(t, f.post(t, `"k1"`, `{}`), 201, false)
		wantStatus(t, f.post(t, `"k1"`, `{}`), 201, true)
		if n := up.n.Load(); n != 2 {
			t.Fatalf("upstream ran %d times, want 2", n)
		}
	})
}

// TestProxyI5ClientDisconnects: the client hangs up while the upstream
// works; the proxy reads the response to the end and stores it; the
// retry replays it; the upstream ran once.
func TestProxyI5ClientDisconnects(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, env testStoreEnv) {
		up := newUpstream(t)
		arrived := make(chan struct{})
		proceed := make(chan struct{})
		up.set(func(n int64, w http.ResponseWriter, _ *http.Request) {
			close(arrived)
			<-proceed
			writeCreated(n, w)
		})
		f := newProxies(t, env, up.URL, 1, nil)[0]
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := f.do(t, ctx, http.MethodPost, "/x", `"k1"`, "alice", `{"a":1}`)
			errc <- err
		}()
		<-arrived
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("client: %v, want context.Canceled", err)
		}
		close(proceed)
		r := retryWhileInProgress(t, f, "/x", `"k1"`, `{"a":1}`)
		wantStatus(t, r, 201, true)
		if r.body != `{"id":1}` || up.n.Load() != 1 {
			t.Fatalf("replay %q after %d upstream runs; want {\"id\":1} after 1", r.body, up.n.Load())
		}
	})
}

// retryWhileInProgress posts until the answer is not 409 in progress
// (bounded: 30 s).
func retryWhileInProgress(t *testing.T, f *pxFront, path, key, body string) pxResp {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := f.do(t, context.Background(), http.MethodPost, path, key, "alice", body)
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		if r.status != http.StatusConflict || time.Now().After(deadline) {
			return r
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// resetConn closes the connection of a handler with a TCP reset.
func resetConn(w http.ResponseWriter) {
	c, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err)
	}
	_ = buf.Flush()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

// TestProxyUpstreamResetStoresUnknownOutcome: the upstream got the
// request and the connection was reset before any response: 502
// upstream-outcome-unknown, stored, so retries replay it and the request
// never reaches the upstream twice. ReleaseUnknownOutcome forwards the
// retry instead.
func TestProxyUpstreamResetStoresUnknownOutcome(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, env testStoreEnv) {
		up := newUpstream(t)
		up.set(func(n int64, w http.ResponseWriter, _ *http.Request) {
			if n == 1 {
				resetConn(w)
				return
			}
			writeCreated(n, w)
		})
		f := newProxies(t, env, up.URL, 1, nil)[0]
		first := f.post(t, `"k1"`, `{"a":1}`)
		if first.status != 502 || first.problemType() != idemhttp.ProblemUpstreamOutcomeUnknown || first.replayed() {
			t.Fatalf("reset: %d %s; want 502 upstream-outcome-unknown", first.status, first.body)
		}
		for range 2 {
			r := f.post(t, `"k1"`, `{"a":1}`)
			wantStatus(t, r, 502, true)
			if r.problemType() != idemhttp.ProblemUpstreamOutcomeUnknown || r.body != first.body {
				t.Fatalf("replay %s, want the stored unknown outcome", r.body)
			}
		}
		if n := up.n.Load(); n != 1 {
			t.Fatalf("upstream ran %d times, want 1 (at most once)", n)
		}

		up2 := newUpstream(t)
		up2.set(func(n int64, w http.ResponseWriter, _ *http.Request) {
			if n == 1 {
				resetConn(w)
				return
			}
			writeCreated(n, w)
		})
		f2 := newProxies(t, env, up2.URL, 1, &idemhttp.ProxyOptions{UnknownOutcome: idemhttp.ReleaseUnknownOutcome})[0]
		r := f2.post(t, `"k1"`, `{"a":1}`)
		if r.status != 502 || r.problemType() != idemhttp.ProblemUpstreamOutcomeUnknown {
			t.Fatalf("release policy: %d %s", r.status, r.body)
		}
		wantStatus(t, f2.post(t, `"k1"`, `{"a":1}`), 201, false)
		if n := up2.n.Load(); n != 2 {
			t.Fatalf("release policy: upstream ran %d times, want 2", n)
		}
	})
}

// TestProxyUpstreamResetMidBody: the upstream sent its status and part of
// the body, then reset: the outcome is unknown (it acted, but what it
// answered is lost); stored as upstream-outcome-unknown, never a
// truncated 201.
func TestProxyUpstreamResetMidBody(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, env testStoreEnv) {
		up := newUpstream(t)
		up.set(func(n int64, w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Length", "1000")
			w.WriteHeader(201)
			io.WriteString(w, `{"id":`)
			http.NewResponseController(w).Flush()
			resetConn(w)
		})
		f := newProxies(t, env, up.URL, 1, nil)[0]
		r := f.post(t, `"k1"`, `{}`)
		if r.status != 502 || r.problemType() != idemhttp.ProblemUpstreamOutcomeUnknown {
			t.Fatalf("mid-body reset: %d %s; want 502 upstream-outcome-unknown", r.status, r.body)
		}
		wantStatus(t, f.post(t, `"k1"`, `{}`), 502, true)
		if n := up.n.Load(); n != 1 {
			t.Fatalf("upstream ran %d times, want 1", n)
		}
	})
}

// TestProxyD2TwoInstances: 100 identical requests at once, split across
// two proxy instances sharing one store: one execution, 99 answers 409.
func TestProxyD2TwoInstances(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, env testStoreEnv) {
		const total = 100
		up := newUpstream(t)
		var conflicts atomic.Int64
		allRejected := make(chan struct{})
		up.set(func(n int64, w http.ResponseWriter, _ *http.Request) {
			select {
			case <-allRejected:
			case <-time.After(30 * time.Second):
			}
			writeCreated(n, w)
		})
		if env.second != env.store && storeName(t) == "sqlite" {
			// Two handles on one SQLite file contend in SQLite's busy
			// handler; the two instances share one handle instead.
			env.second = env.store
		}
		fronts := newProxies(t, env, up.URL, 2, nil)
		var wg sync.WaitGroup
		var created atomic.Int64
		var others sync.Map
		start := make(chan struct{})
		for i := range total {
			wg.Go(func() {
				<-start
				r, err := fronts[i%2].do(t, context.Background(), http.MethodPost, "/x", `"k-d2"`, "alice", `{"a":1}`)
				switch {
				case err != nil:
					others.Store(i, err.Error())
				case r.status == 201 && !r.replayed():
					created.Add(1)
				case r.status == 409 && r.problemType() == idemhttp.ProblemInProgress && r.header.Get("Retry-After") != "":
					if conflicts.Add(1) == total-1 {
						close(allRejected)
					}
				default:
					others.Store(i, fmt.Sprintf("%d %s", r.status, r.body))
				}
			})
		}
		close(start)
		wg.Wait()
		others.Range(func(k, v any) bool {
			t.Errorf("request %v: %v", k, v)
			return true
		})
		if created.Load() != 1 || conflicts.Load() != total-1 || up.n.Load() != 1 {
			t.Fatalf("created %d, 409 %d, upstream ran %d; want 1, %d, 1", created.Load(), conflicts.Load(), up.n.Load(), total-1)
		}
		// Both instances replay it now.
		for _, f := range fronts {
			wantStatus(t, f.post(t, `"k-d2"`, `{"a":1}`), 201, true)
		}
	})
}

// TestProxyScopeHeader: keys are scoped by the Authorization header (F1,
// F2), hashed; a request without it is refused (F4) unless PassUnscoped.
func TestProxyScopeHeader(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, env testStoreEnv) {
		up := newUpstream(t)
		f := newProxies(t, env, up.URL, 1, nil)[0]
		ctx := context.Background()
		a, _ := f.do(t, ctx, http.MethodPost, "/x", `"k1"`, "alice", `{"a":1}`)
		b, _ := f.do(t, ctx, http.MethodPost, "/x", `"k1"`, "bob", `{"a":1}`)
		wantStatus(t, a, 201, false)
		wantStatus(t, b, 201, false)
		if a.body == b.body || up.n.Load() != 2 {
			t.Fatalf("alice %s, bob %s, upstream %d: want two executions", a.body, b.body, up.n.Load())
		}
		a2, _ := f.do(t, ctx, http.MethodPost, "/x", `"k1"`, "alice", `{"a":1}`)
		b2, _ := f.do(t, ctx, http.MethodPost, "/x", `"k1"`, "bob", `{"a":1}`)
		if !a2.replayed() || a2.body != a.body || !b2.replayed() || b2.body != b.body {
			t.Fatalf("each user must replay their own response: %s %s", a2.body, b2.body)
		}
		none, _ := f.do(t, ctx, http.MethodPost, "/x", `"k1"`, "", `{"a":1}`)
		if none.status != 401 || none.problemType() != idemhttp.ProblemScopeMissing || up.n.Load() != 2 {
			t.Fatalf("no Authorization: %d %s; want 401 scope-missing, not forwarded", none.status, none.body)
		}

		// Another header, e.g. a tenant ID.
		up2 := newUpstream(t)
		f2 := newProxies(t, env, up2.URL, 1, &idemhttp.ProxyOptions{ScopeHeader: "X-Tenant", Options: idemhttp.Options{Unscoped: idemhttp.PassUnscoped}})[0]
		r, _ := f2.do(t, ctx, http.MethodPost, "/x", `"k1"`, "alice", `{}`)
		r2, _ := f2.do(t, ctx, http.MethodPost, "/x", `"k1"`, "alice", `{}`)
		if r.status != 201 || r.replayed() || r2.replayed() || up2.n.Load() != 2 {
			t.Fatalf("no X-Tenant under PassUnscoped: want pass-through twice, got %d/%v %d/%v", r.status, r.replayed(), r2.status, r2.replayed())
		}
	})
}

// TestProxyH5EventStream: an upstream Server-Sent Events stream reaches
// the client event by event (the second event is sent only after the
// client has read the first); its replay is the concatenated events.
func TestProxyH5EventStream(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, env testStoreEnv) {
		up := newUpstream(t)
		got := make(chan struct{}, 5)
		up.set(func(_ int64, w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(200)
			for i := range 5 {
				fmt.Fprintf(w, "data: %d\n\n", i)
				http.NewResponseController(w).Flush()
				if i < 4 {
					select {
					case <-got:
					case <-time.After(30 * time.Second):
						return
					}
				}
			}
		})
		f := newProxies(t, env, up.URL, 1, nil)[0]
		req, _ := http.NewRequest(http.MethodPost, f.srv.URL+"/events", strings.NewReader("{}"))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idemhttp.HeaderIdempotencyKey, `"sse"`)
		req.Header.Set("Authorization", "Bearer alice")
		resp, err := f.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(resp.Body)
		var all strings.Builder
		for i := range 5 {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("event %d: %v", i, err)
			}
			blank, _ := br.ReadString('\n')
			all.WriteString(line + blank)
			if line != fmt.Sprintf("data: %d\n", i) {
				t.Fatalf("event %d = %q", i, line)
			}
			got <- struct{}{} // the upstream sends the next event only now
		}
		resp.Body.Close()
		r2 := retryWhileInProgress(t, f, "/events", `"sse"`, "{}")
		wantStatus(t, r2, 200, true)
		if r2.body != all.String() || up.n.Load() != 1 {
			t.Fatalf("replay %q, want %q; upstream ran %d times", r2.body, all.String(), up.n.Load())
		}
	})
}

// TestProxyHealth: the health path is answered by the proxy with the
// store's reachability, never forwarded; the body is fixed and the store's
// error (which names users, databases, addresses) goes to the log only.
func TestProxyHealth(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	var down atomic.Bool
	var logs lockedBuffer
	const reason = "dial tcp 10.9.8.7:5432: user=payments_rw database=ledger: connection refused"
	env := testStoreEnv{store: idem.NewMemoryStore(nil)}
	f := newProxies(t, env, up.URL, 1, &idemhttp.ProxyOptions{
		ScopeSecret: []byte("0123456789abcdef"),
		Options:     idemhttp.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))},
		Health: func(context.Context) error {
			if down.Load() {
				return errors.New(reason)
			}
			return nil
		}})[0]
	r, err := f.do(t, context.Background(), http.MethodGet, "/healthz", "", "", "")
	if err != nil || r.status != 200 || r.body != `{"status":"ok"}`+"\n" {
		t.Fatalf("healthz: %v %d %q", err, r.status, r.body)
	}
	if logs.String() != "" {
		t.Fatalf("a healthy check logged: %s", logs.String())
	}
	down.Store(true)
	r, _ = f.do(t, context.Background(), http.MethodGet, "/healthz", "", "", "")
	if r.status != 503 || r.body != `{"status":"unavailable"}`+"\n" || r.header.Get("Cache-Control") != "no-store" {
		t.Fatalf("healthz with the store down: %d %q %v", r.status, r.body, r.header)
	}
	if got := logs.String(); !strings.Contains(got, "health check failed") || !strings.Contains(got, "10.9.8.7:5432") {
		t.Fatalf("the log lacks the reason: %s", got)
	}
	if up.n.Load() != 0 {
		t.Fatalf("health checks reached the upstream")
	}
}

func TestNewProxyInvalid(t *testing.T) {
	t.Parallel()
	st := idem.NewMemoryStore(nil)
	good, _ := url.Parse("http://127.0.0.1:1")
	for _, tt := range []struct {
		name string
		u    string
		o    idemhttp.ProxyOptions
	}{
		{"relative upstream", "/x", idemhttp.ProxyOptions{}},
		{"ftp upstream", "ftp://h/", idemhttp.ProxyOptions{}},
		{"negative timeout", "", idemhttp.ProxyOptions{UpstreamTimeout: -1}},
		{"health path", "", idemhttp.ProxyOptions{HealthPath: "healthz"}},
		{"scope header", "", idemhttp.ProxyOptions{ScopeHeader: "Bad Header"}},
		{"policy", "", idemhttp.ProxyOptions{UnknownOutcome: 9}},
		{"middleware option", "", idemhttp.ProxyOptions{Options: idemhttp.Options{Lease: time.Millisecond}}},
		{"short scope secret", "", idemhttp.ProxyOptions{ScopeSecret: []byte("short")}},
		{"scope secret with a Scope", "", idemhttp.ProxyOptions{ScopeSecret: []byte("0123456789abcdef"), Options: idemhttp.Options{Scope: idemhttp.HeaderScope("X-User")}}},
	} {
		u := good
		if tt.u != "" {
			u, _ = url.Parse(tt.u)
		}
		if p, err := idemhttp.NewProxy(u, st, &tt.o); !errors.Is(err, idem.ErrInvalidConfig) {
			if p != nil {
				p.Close()
			}
			t.Errorf("%s: err %v, want ErrInvalidConfig", tt.name, err)
		}
	}
}

// The proxy front of the scenario runner (scenario_test.go): H served by
// an upstream server, an instance of the proxy in front of it. Every
// tagBoth scenario runs through it on every store.
func init() {
	scFronts = append(scFronts, scFront{name: "px", proxy: true, start: startProxyFront})
}

func startProxyFront(t *testing.T, store idemdriver.LeaseStore, h http.Handler, cfg scConfig) *scInstance {
	t.Helper()
	up := httptest.NewServer(h)
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	o := &idemhttp.ProxyOptions{Options: cfg.opts}
	if cfg.require {
		o.Options.RequireKey = true
	}
	p, err := idemhttp.NewProxy(u, store, o)
	if err != nil {
		t.Fatalf("NewProxy: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	var hh http.Handler = p
	if cfg.outer != nil {
		hh = cfg.outer(hh)
	}
	srv := httptest.NewServer(hh)
	t.Cleanup(srv.Close)
	m := p.Middleware()
	defaultScope := idemhttp.HeaderScope(idemhttp.DefaultProxyScopeHeader)
	return &scInstance{
		URL:   srv.URL,
		purge: m.Purge,
		stats: m.Stats,
		record: func(user, key string) (string, string) {
			scope := scUsers[user]
			if cfg.opts.Scope == nil {
				r := &http.Request{Header: http.Header{"Authorization": {scUsers[user]}}}
				scope, _ = defaultScope(r)
			}
			return m.Consumer(), m.RecordID(scope, key)
		},
	}
}

// TestProxyResetWhileStreaming: a reset after part of a large response
// already reached the client: the client's connection is aborted (it
// never sees a short body as complete) and, the upstream having processed
// the request, the key stores upstream-outcome-unknown: the retry gets it
// and never reaches the upstream (at most once per key).
func TestProxyResetWhileStreaming(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	chunk := strings.Repeat("x", 64<<10)
	streamed := make(chan struct{})
	up.set(func(n int64, w http.ResponseWriter, _ *http.Request) {
		if n > 1 {
			writeCreated(n, w)
			return
		}
		w.Header().Set("Content-Length", fmt.Sprint(4<<20))
		w.WriteHeader(200)
		for range 32 { // 2 MiB, over the 1 MiB hold limit
			io.WriteString(w, chunk)
		}
		http.NewResponseController(w).Flush()
		select {
		case <-streamed: // the client has received part of it
		case <-time.After(30 * time.Second):
		}
		resetConn(w)
	})
	f := newProxies(t, testStoreEnv{store: idem.NewMemoryStore(nil)}, up.URL, 1, nil)[0]
	req, _ := http.NewRequest(http.MethodPost, f.srv.URL+"/x", strings.NewReader(`{}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer alice")
	req.Header.Set(idemhttp.HeaderIdempotencyKey, `"k1"`)
	resp, err := f.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, 1<<20+1)); err != nil || resp.StatusCode != 200 {
		t.Fatalf("streaming: %d, %v", resp.StatusCode, err)
	}
	close(streamed)
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err == nil {
		t.Fatalf("the client read a truncated body (%d more bytes) without an error", n)
	}
	r := f.post(t, `"k1"`, `{}`)
	wantStatus(t, r, http.StatusBadGateway, true)
	if r.problemType() != idemhttp.ProblemUpstreamOutcomeUnknown {
		t.Fatalf("retry: problem %q", r.problemType())
	}
	if n := up.n.Load(); n != 1 {
		t.Fatalf("upstream ran %d times, want 1 (unknown outcome stored)", n)
	}
}

// TestProxyTrailers: trailers of the upstream response, announced or not,
// reach the client of the executing request as trailers (not as header
// fields), and are not part of the stored response.
func TestProxyTrailers(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	up.set(func(n int64, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Sum")
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("X-Kept", "header")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "body")
		w.Header().Set("X-Sum", "abc")
		w.Header().Set(http.TrailerPrefix+"X-Late", "late")
		w.Header().Set(http.TrailerPrefix+"X-Kept", "trailer")
	})
	f := newProxies(t, testStores[0].open(t), up.URL, 1, nil)[0]
	send := func() (*http.Response, string) {
		req, err := http.NewRequest(http.MethodPost, f.srv.URL+"/x", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(idemhttp.HeaderIdempotencyKey, `"trailers"`)
		req.Header.Set("Authorization", "Bearer alice")
		resp, err := f.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, string(b)
	}
	resp, body := send()
	if resp.StatusCode != 201 || body != "body" || resp.Header.Get("X-Kept") != "header" {
		t.Fatalf("first: %d %q %v", resp.StatusCode, body, resp.Header)
	}
	if got := resp.Trailer.Get("X-Sum"); got != "abc" {
		t.Fatalf("trailer X-Sum %q, want abc (trailers %v, header %v)", got, resp.Trailer, resp.Header)
	}
	if got := resp.Trailer.Get("X-Late"); got != "late" {
		t.Fatalf("trailer X-Late %q, want late (trailers %v)", got, resp.Trailer)
	}
	if resp.Header.Get("X-Sum") != "" || resp.Header.Get("X-Late") != "" {
		t.Fatalf("a trailer became a header field: %v", resp.Header)
	}
	replay, body := send()
	if replay.Header.Get(idemhttp.HeaderReplayed) != "true" || replay.StatusCode != 201 || body != "body" || replay.Header.Get("X-Kept") != "header" {
		t.Fatalf("replay: %d %q %v", replay.StatusCode, body, replay.Header)
	}
	if replay.Header.Get("X-Sum") != "" || replay.Header.Get("X-Late") != "" || len(replay.Trailer) != 0 {
		t.Fatalf("replay has trailers: header %v, trailers %v", replay.Header, replay.Trailer)
	}
	if n := up.n.Load(); n != 1 {
		t.Fatalf("upstream ran %d times, want 1", n)
	}
}

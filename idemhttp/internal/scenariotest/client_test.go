package scenariotest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// scriptServer answers the n-th request (from 1) with script(n, w, r) and
// records every request's key and body.
type scriptServer struct {
	*httptest.Server
	mu     sync.Mutex
	keys   []string
	bodies []string
	method []string
}

func newScriptServer(t *testing.T, script func(n int, w http.ResponseWriter, r *http.Request)) *scriptServer {
	t.Helper()
	s := &scriptServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.keys = append(s.keys, r.Header.Get("Idempotency-Key"))
		s.bodies = append(s.bodies, string(body))
		s.method = append(s.method, r.Method)
		n := len(s.keys)
		s.mu.Unlock()
		script(n, w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *scriptServer) calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.keys)
}

func (s *scriptServer) seenKeys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...)
}

// fastOpts are transport options with millisecond backoff and no shared
// budget, for tests.
func fastOpts(base http.RoundTripper) *idemhttp.TransportOptions {
	return &idemhttp.TransportOptions{
		Base:            base,
		InitialInterval: time.Millisecond,
		MaxInterval:     5 * time.Millisecond,
		MaxRetryAfter:   10 * time.Millisecond,
		MaxAttempts:     4,
		DisableBudget:   true,
	}
}

// noKeepAlive is a base transport that opens a connection per request, so
// net/http never retries a request itself on a reused connection and the
// server's counts are the Transport's attempts.
func noKeepAlive() *http.Transport {
	return &http.Transport{DisableKeepAlives: true}
}

func newTestClient(t *testing.T, o *idemhttp.TransportOptions) *http.Client {
	t.Helper()
	c, err := idemhttp.NewClient(o)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	return c
}

func post(t *testing.T, c *http.Client, ctx context.Context, url, body string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	return c.Do(req)
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return string(b)
}

func TestTransportOneKeyPerOperationReusedAcrossRetries(t *testing.T) {
	t.Parallel()
	srv := newScriptServer(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n < 3 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, n)
	})
	c := newTestClient(t, fastOpts(nil))

	resp, err := post(t, c, context.Background(), srv.URL, `{"a":1}`)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusCreated || readAll(t, resp) != `{"id":3}` {
		t.Fatalf("got %d, want 201 {\"id\":3}", resp.StatusCode)
	}
	keys := srv.seenKeys()
	if len(keys) != 3 {
		t.Fatalf("server saw %d attempts, want 3", len(keys))
	}
	for i, k := range keys {
		if k != keys[0] {
			t.Fatalf("attempt %d sent key %q, attempt 1 sent %q: want one key per operation", i+1, k, keys[0])
		}
	}
	for i, b := range srv.bodies {
		if b != `{"a":1}` {
			t.Fatalf("attempt %d sent body %q, want the same body every time", i+1, b)
		}
	}
	u, err := uuid.Parse(strings.Trim(keys[0], `"`))
	if err != nil || u.Version() != 7 || !strings.HasPrefix(keys[0], `"`) {
		t.Fatalf("key %q: want a quoted UUIDv7 (sf-string)", keys[0])
	}

	// A second operation gets a key of its own.
	resp, err = post(t, c, context.Background(), srv.URL, `{"a":1}`)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	keys = srv.seenKeys()
	if len(keys) != 4 || keys[3] == keys[0] {
		t.Fatalf("second operation: keys %q, want a new key", keys)
	}
}

// problem returns a writer of the middleware's own answer of type typ.
func problem(typ string, status int) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		(&idemhttp.Problem{Type: typ, Title: "t", Status: status}).Write(w)
	}
}

// inProgress writes the 409 the middleware sends for a duplicate in flight.
func inProgress(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Retry-After", "0")
	w.WriteHeader(http.StatusConflict)
	io.WriteString(w, `{"type":"https://idem-go.dev/problems/request-in-progress","title":"in progress","status":409}`)
}

func TestTransportRetriesOnlyRetryableOutcomes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		write     func(w http.ResponseWriter)
		wantCalls int
	}{
		{"201", func(w http.ResponseWriter) { w.WriteHeader(201) }, 1},
		{"200", func(w http.ResponseWriter) { w.WriteHeader(200) }, 1},
		{"400", func(w http.ResponseWriter) { w.WriteHeader(400) }, 1},
		{"401", func(w http.ResponseWriter) { w.WriteHeader(401) }, 1},
		{"402", func(w http.ResponseWriter) { w.WriteHeader(402) }, 1},
		{"404", func(w http.ResponseWriter) { w.WriteHeader(404) }, 1},
		{"408", func(w http.ResponseWriter) { w.WriteHeader(408) }, 1},
		{"413", func(w http.ResponseWriter) { w.WriteHeader(413) }, 1},
		{"422 key reused", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(422)
			io.WriteString(w, `{"type":"https://idem-go.dev/problems/idempotency-key-reused","status":422}`)
		}, 1},
		{"409 plain", func(w http.ResponseWriter) { w.WriteHeader(409) }, 1},
		{"409 other problem", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(409)
			io.WriteString(w, `{"type":"https://example.com/problems/version-conflict","status":409}`)
		}, 1},
		{"409 in progress", inProgress, 4},
		{"429", func(w http.ResponseWriter) { w.WriteHeader(429) }, 4},
		{"500", func(w http.ResponseWriter) { w.WriteHeader(500) }, 4},
		{"501", func(w http.ResponseWriter) { w.WriteHeader(501) }, 4},
		{"502", func(w http.ResponseWriter) { w.WriteHeader(502) }, 4},
		{"503", func(w http.ResponseWriter) { w.WriteHeader(503) }, 4},
		{"504", func(w http.ResponseWriter) { w.WriteHeader(504) }, 4},
		// The middleware's and proxy's own answers carry
		// Stripe-Should-Retry, which decides: their final 5xx are not
		// retried, their 409 lease-lost is.
		{"500 outcome unknown", problem(idemhttp.ProblemOutcomeUnknown, 500), 1},
		{"500 record corrupt", problem(idemhttp.ProblemRecordCorrupt, 500), 1},
		{"502 upstream outcome unknown", problem(idemhttp.ProblemUpstreamOutcomeUnknown, 502), 1},
		{"409 lease lost", problem(idemhttp.ProblemLeaseLost, 409), 4},
		{"503 unavailable", problem(idemhttp.ProblemUnavailable, 503), 4},
		{"500 should not retry", func(w http.ResponseWriter) {
			w.Header().Set(idemhttp.HeaderShouldRetry, "false")
			w.WriteHeader(500)
		}, 1},
		{"400 should retry", func(w http.ResponseWriter) {
			w.Header().Set(idemhttp.HeaderShouldRetry, "true")
			w.WriteHeader(400)
		}, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newScriptServer(t, func(n int, w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("X-Attempt", fmt.Sprint(n))
				tt.write(w)
			})
			// A connection of its own per attempt: a pooled one of the
			// shared default transport may be closed under an attempt
			// when a parallel test's server closes, which the server's
			// count of attempts would not see.
			c := newTestClient(t, fastOpts(noKeepAlive()))
			resp, err := post(t, c, context.Background(), srv.URL, `{}`)
			if err != nil {
				t.Fatal(err)
			}
			body := readAll(t, resp)
			if got := srv.calls(); got != tt.wantCalls {
				t.Fatalf("server saw %d attempts, want %d", got, tt.wantCalls)
			}
			// The caller gets the last response, body intact.
			if got := resp.Header.Get("X-Attempt"); got != fmt.Sprint(tt.wantCalls) {
				t.Fatalf("returned the response of attempt %s, want %d", got, tt.wantCalls)
			}
			if tt.name == "409 other problem" || tt.name == "409 in progress" || tt.name == "422 key reused" {
				if !strings.Contains(body, `"status":`) {
					t.Fatalf("problem body lost: %q", body)
				}
			}
		})
	}
}

// dropServer closes the connection without a response for the first drops
// requests, then answers 201.
func dropServer(t *testing.T, drops int) *scriptServer {
	return newScriptServer(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n <= drops {
			c, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				if tc, ok := c.(*net.TCPConn); ok {
					_ = tc.SetLinger(0) // a reset, not a clean close
				}
				c.Close()
			}
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "ok")
	})
}

func TestTransportRetriesNetworkErrors(t *testing.T) {
	t.Parallel()
	srv := dropServer(t, 2)
	c := newTestClient(t, fastOpts(noKeepAlive()))
	resp, err := post(t, c, context.Background(), srv.URL, `{"a":1}`)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 201 || readAll(t, resp) != "ok" {
		t.Fatalf("got %d, want 201", resp.StatusCode)
	}
	keys := srv.seenKeys()
	if len(keys) != 3 || keys[0] != keys[1] || keys[1] != keys[2] {
		t.Fatalf("keys %q: want 3 attempts with one key", keys)
	}
}

// TestTransportRetriesBrokenPooledConnection: an attempt whose pooled
// connection was closed under it (net/http's "transport connection
// broken", as CloseIdleConnections on a shared transport causes) is
// retried with the same key.
func TestTransportRetriesBrokenPooledConnection(t *testing.T) {
	t.Parallel()
	srv := newScriptServer(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(201)
		io.WriteString(w, "ok")
	})
	var attempts atomic.Int32
	base := noKeepAlive()
	broken := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if attempts.Add(1) == 1 {
			return nil, fmt.Errorf("net/http: HTTP/1.x transport connection broken: %w", errors.New("http: CloseIdleConnections called"))
		}
		return base.RoundTrip(r)
	})
	c := newTestClient(t, fastOpts(broken))
	resp, err := post(t, c, context.Background(), srv.URL, `{}`)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 201 || readAll(t, resp) != "ok" || attempts.Load() != 2 || srv.calls() != 1 {
		t.Fatalf("got %d after %d attempts (%d at the server), want 201 after 2 (1)", resp.StatusCode, attempts.Load(), srv.calls())
	}
}

// roundTripFunc is an http.RoundTripper of a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestTransportGivesUpWithRetryError(t *testing.T) {
	t.Parallel()
	// A port nobody listens on: every dial is refused. 127.0.0.7, where
	// no other test's server listens, so the port is not reused meanwhile.
	l, err := net.Listen("tcp", "127.0.0.7:0")
	if err != nil {
		l, err = net.Listen("tcp", "127.0.0.1:0")
	}
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	var retries []int
	o := fastOpts(noKeepAlive())
	o.OnRetry = func(key string, attempt int, reason error, wait time.Duration) {
		retries = append(retries, attempt)
		if wait < 0 || wait > 5*time.Millisecond {
			t.Errorf("wait %v outside [0, MaxInterval]", wait)
		}
	}
	c := newTestClient(t, o)
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/x", strings.NewReader("{}"))
	req.Header.Set("Idempotency-Key", `"k-1"`)
	_, err = c.Do(req)
	var re *idemhttp.RetryError
	if !errors.As(err, &re) {
		t.Fatalf("err = %v, want a *RetryError", err)
	}
	if re.Attempts != 4 || re.Key != `"k-1"` || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("RetryError %+v: want 4 attempts, key \"k-1\", wrapping ECONNREFUSED", re)
	}
	if fmt.Sprint(retries) != "[1 2 3]" {
		t.Fatalf("OnRetry after attempts %v, want [1 2 3]", retries)
	}
}

func TestTransportCallerKey(t *testing.T) {
	t.Parallel()
	srv := newScriptServer(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n%2 == 1 {
			w.WriteHeader(503)
			return
		}
		w.WriteHeader(201)
	})
	c := newTestClient(t, fastOpts(nil))

	// From the request header: kept as is, even on PUT.
	req, _ := http.NewRequest(http.MethodPut, srv.URL, strings.NewReader("x"))
	req.Header.Set("Idempotency-Key", "order-42")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	// From the context.
	resp, err = post(t, c, idemhttp.ContextWithKey(context.Background(), `"order-43"`), srv.URL, "y")
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	want := []string{"order-42", "order-42", `"order-43"`, `"order-43"`}
	if got := srv.seenKeys(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("keys %q, want %q", got, want)
	}
	if req.Header.Get("Idempotency-Key") != "order-42" || len(req.Header) != 1 {
		t.Fatalf("the caller's request was modified: %v", req.Header)
	}
}

func TestTransportOtherMethodsPassThrough(t *testing.T) {
	t.Parallel()
	srv := newScriptServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(503) })
	c := newTestClient(t, fastOpts(nil))
	for _, m := range []string{http.MethodGet, http.MethodDelete, http.MethodPut, http.MethodHead} {
		req, _ := http.NewRequest(m, srv.URL, nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
	}
	if got := srv.seenKeys(); fmt.Sprint(got) != "[   ]" {
		t.Fatalf("keys %q: want 4 single attempts without a key", got)
	}
	// Methods is configurable.
	o := fastOpts(nil)
	o.Methods = []string{"put"}
	c = newTestClient(t, o)
	req, _ := http.NewRequest(http.MethodPut, srv.URL, nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if got := srv.calls(); got != 4+4 {
		t.Fatalf("PUT enabled: %d calls in all, want 8", got)
	}
}

func TestTransportRetryAfter(t *testing.T) {
	t.Parallel()
	t.Run("seconds honoured", func(t *testing.T) {
		t.Parallel()
		srv := newScriptServer(t, func(n int, w http.ResponseWriter, _ *http.Request) {
			if n == 1 {
				w.Header().Set("Retry-After", "1")
				w.WriteHeader(429)
				return
			}
			w.WriteHeader(201)
		})
		o := fastOpts(nil)
		o.MaxRetryAfter = 0 // the default cap, 30 s
		c := newTestClient(t, o)
		start := time.Now()
		resp, err := post(t, c, context.Background(), srv.URL, "{}")
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		if el := time.Since(start); el < 900*time.Millisecond || resp.StatusCode != 201 {
			t.Fatalf("status %d after %v: want 201 after waiting Retry-After (1 s)", resp.StatusCode, el)
		}
	})
	t.Run("capped", func(t *testing.T) {
		t.Parallel()
		srv := newScriptServer(t, func(n int, w http.ResponseWriter, _ *http.Request) {
			if n == 1 {
				w.Header().Set("Retry-After", "3600")
				w.WriteHeader(503)
				return
			}
			w.WriteHeader(201)
		})
		var waits []time.Duration
		o := fastOpts(nil)
		o.MaxRetryAfter = 20 * time.Millisecond
		o.OnRetry = func(_ string, _ int, _ error, wait time.Duration) { waits = append(waits, wait) }
		c := newTestClient(t, o)
		resp, err := post(t, c, context.Background(), srv.URL, "{}")
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		if resp.StatusCode != 201 || len(waits) != 1 || waits[0] != 20*time.Millisecond {
			t.Fatalf("status %d waits %v: want 201 after one wait of MaxRetryAfter (20ms)", resp.StatusCode, waits)
		}
	})
	t.Run("longer than MaxElapsed", func(t *testing.T) {
		t.Parallel()
		srv := newScriptServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Retry-After", "5")
			w.WriteHeader(503)
		})
		o := fastOpts(nil)
		o.MaxRetryAfter = 0
		o.MaxElapsed = 2 * time.Second
		c := newTestClient(t, o)
		start := time.Now()
		resp, err := post(t, c, context.Background(), srv.URL, "{}")
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		if srv.calls() != 1 || resp.StatusCode != 503 || time.Since(start) > time.Second {
			t.Fatalf("%d calls, status %d: want the 503 at once (a 5 s wait exceeds MaxElapsed)", srv.calls(), resp.StatusCode)
		}
	})
}

func TestTransportRetryBudget(t *testing.T) {
	t.Parallel()
	srv := newScriptServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(503) })
	budget, err := idemhttp.NewRetryBudget(0.5, 2)
	if err != nil {
		t.Fatal(err)
	}
	o := fastOpts(nil)
	o.DisableBudget = false
	o.Budget = budget
	o.MaxAttempts = 10
	c := newTestClient(t, o)
	// Operation 1: deposit 0.5 (capped at 2), 2 retries spend it: 3 calls.
	// Operation 2: deposit 0.5, no whole retry: 1 call.
	// Operation 3: deposit 0.5, balance 1: one retry: 2 calls.
	for i, want := range []int{3, 4, 6} {
		resp, err := post(t, c, context.Background(), srv.URL, "{}")
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		if resp.StatusCode != 503 || srv.calls() != want {
			t.Fatalf("operation %d: %d calls in all, status %d; want %d calls", i+1, srv.calls(), resp.StatusCode, want)
		}
	}
	for _, bad := range []struct {
		ratio float64
		burst int
	}{{-1, 1}, {0.1, 0}, {2000, 1}} {
		if _, err := idemhttp.NewRetryBudget(bad.ratio, bad.burst); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("NewRetryBudget(%v, %d) = %v, want ErrInvalidConfig", bad.ratio, bad.burst, err)
		}
	}
}

func TestTransportBodyNotReplayable(t *testing.T) {
	t.Parallel()
	t.Run("response", func(t *testing.T) {
		t.Parallel()
		srv := newScriptServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(503) })
		c := newTestClient(t, fastOpts(nil))
		req, _ := http.NewRequest(http.MethodPost, srv.URL, io.NopCloser(strings.NewReader("stream")))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		if srv.calls() != 1 || resp.StatusCode != 503 {
			t.Fatalf("%d calls, status %d: want the one 503", srv.calls(), resp.StatusCode)
		}
	})
	t.Run("network error", func(t *testing.T) {
		t.Parallel()
		srv := dropServer(t, 1)
		c := newTestClient(t, fastOpts(noKeepAlive()))
		req, _ := http.NewRequest(http.MethodPost, srv.URL, io.NopCloser(strings.NewReader("stream")))
		_, err := c.Do(req)
		if !errors.Is(err, idemhttp.ErrBodyNotReplayable) || srv.calls() != 1 {
			t.Fatalf("err %v after %d calls: want ErrBodyNotReplayable after 1", err, srv.calls())
		}
	})
}

func TestTransportContextEndsRetries(t *testing.T) {
	t.Parallel()
	srv := newScriptServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "30")
		w.WriteHeader(503)
	})
	o := fastOpts(nil)
	o.MaxRetryAfter = 0
	retrying := make(chan struct{})
	o.OnRetry = func(string, int, error, time.Duration) { close(retrying) }
	c := newTestClient(t, o)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-retrying
		cancel()
	}()
	start := time.Now()
	_, err := post(t, c, ctx, srv.URL, "{}")
	if !errors.Is(err, context.Canceled) || srv.calls() != 1 || time.Since(start) > 10*time.Second {
		t.Fatalf("err %v after %d calls: want context.Canceled after 1, without the 30 s wait", err, srv.calls())
	}
}

func TestNewTransportInvalid(t *testing.T) {
	t.Parallel()
	for _, o := range []idemhttp.TransportOptions{
		{MaxAttempts: -1},
		{MaxElapsed: -time.Second},
		{Multiplier: 0.5},
		{InitialInterval: time.Second, MaxInterval: time.Millisecond},
		{MaxRetryAfter: -1},
	} {
		if _, err := idemhttp.NewTransport(&o); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("NewTransport(%+v) = %v, want ErrInvalidConfig", o, err)
		}
	}
}

// clientAndProxy returns a client with fast retries and a proxy (memory
// store) in front of up.
func clientAndProxy(t *testing.T, up *upstream, o *idemhttp.TransportOptions) (*http.Client, *pxFront) {
	t.Helper()
	f := newProxies(t, testStoreEnv{store: idem.NewMemoryStore(nil)}, up.URL, 1, nil)[0]
	if o == nil {
		o = fastOpts(nil)
	}
	if o.Base == nil {
		tr := &http.Transport{}
		t.Cleanup(tr.CloseIdleConnections)
		o.Base = tr
	}
	return newTestClient(t, o), f
}

func clientPost(t *testing.T, c *http.Client, ctx context.Context, url, body string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/payments", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer alice")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	return resp, readAll(t, resp)
}

// TestClientThroughProxy: the upstream fails twice with 503 (released by
// the proxy); the client's retries carry one key, the third attempt is
// recorded, and a later retry of the same operation is a replay.
func TestClientThroughProxy(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	up.set(func(n int64, w http.ResponseWriter, _ *http.Request) {
		if n < 3 {
			w.WriteHeader(503)
			return
		}
		writeCreated(n, w)
	})
	c, f := clientAndProxy(t, up, nil)
	resp, body := clientPost(t, c, context.Background(), f.srv.URL, `{"amount":100}`)
	if resp.StatusCode != 201 || body != `{"id":3}` || up.n.Load() != 3 {
		t.Fatalf("%d %s after %d upstream calls; want 201 {\"id\":3} after 3", resp.StatusCode, body, up.n.Load())
	}
	keys := up.seenKeys()
	if keys[0] != keys[1] || keys[1] != keys[2] {
		t.Fatalf("upstream saw keys %q: want one key for the operation", keys)
	}
	// The caller retries the operation later (after a crash, say) with
	// the key it saved: a replay, no new upstream call.
	resp, body = clientPost(t, c, idemhttp.ContextWithKey(context.Background(), keys[0]), f.srv.URL, `{"amount":100}`)
	if resp.StatusCode != 201 || resp.Header.Get(idemhttp.HeaderReplayed) != "true" || body != `{"id":3}` || up.n.Load() != 3 {
		t.Fatalf("retry with the saved key: %d %q %s, upstream %d calls", resp.StatusCode, resp.Header.Get(idemhttp.HeaderReplayed), body, up.n.Load())
	}
}

// TestClientRetriesInProgress: a second operation with the same key while
// the first runs gets 409 request-in-progress, retries, and ends with the
// first's response replayed; the upstream ran once.
func TestClientRetriesInProgress(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	gate := make(chan struct{})
	entered := make(chan struct{})
	up.set(func(n int64, w http.ResponseWriter, _ *http.Request) {
		close(entered)
		select {
		case <-gate:
		case <-time.After(30 * time.Second):
		}
		writeCreated(n, w)
	})
	var once sync.Once
	o := fastOpts(nil)
	o.MaxAttempts = 1000
	o.MaxElapsed = 30 * time.Second
	o.OnRetry = func(_ string, _ int, reason error, _ time.Duration) {
		once.Do(func() { close(gate) }) // the first 409: let the first request finish
	}
	c, f := clientAndProxy(t, up, o)
	ctx := idemhttp.ContextWithKey(context.Background(), `"op-1"`)
	first := make(chan string, 1)
	go func() {
		resp, body := clientPost(t, c, ctx, f.srv.URL, `{"amount":100}`)
		first <- fmt.Sprint(resp.StatusCode, resp.Header.Get(idemhttp.HeaderReplayed), body)
	}()
	<-entered
	resp, body := clientPost(t, c, ctx, f.srv.URL, `{"amount":100}`)
	if resp.StatusCode != 201 || resp.Header.Get(idemhttp.HeaderReplayed) != "true" || body != `{"id":1}` {
		t.Fatalf("second: %d %q %s; want the replay of the first", resp.StatusCode, resp.Header.Get(idemhttp.HeaderReplayed), body)
	}
	if got := <-first; got != `201{"id":1}` {
		t.Fatalf("first: %s", got)
	}
	if up.n.Load() != 1 || f.proxy.Middleware().Stats().InProgress < 1 {
		t.Fatalf("upstream ran %d times, %d answers 409; want 1 and >= 1", up.n.Load(), f.proxy.Middleware().Stats().InProgress)
	}
}

// TestClientDoesNotRetryKeyReuse: 422 (the key was used with another
// body) is final: one attempt.
func TestClientDoesNotRetryKeyReuse(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	c, f := clientAndProxy(t, up, nil)
	ctx := idemhttp.ContextWithKey(context.Background(), `"op-2"`)
	if resp, _ := clientPost(t, c, ctx, f.srv.URL, `{"amount":100}`); resp.StatusCode != 201 {
		t.Fatalf("first: %d", resp.StatusCode)
	}
	resp, body := clientPost(t, c, ctx, f.srv.URL, `{"amount":200}`)
	st := f.proxy.Middleware().Stats()
	if resp.StatusCode != 422 || !strings.Contains(body, "idempotency-key-reused") || st.KeyReused != 1 || up.n.Load() != 1 {
		t.Fatalf("reuse: %d %s, %d answers 422, upstream %d; want one 422", resp.StatusCode, body, st.KeyReused, up.n.Load())
	}
}

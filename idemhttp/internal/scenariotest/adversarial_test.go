package scenariotest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemhttp"
)

// advServer serves h behind a fresh Middleware on store.
func advServer(t *testing.T, store idemdriver.LeaseStore, h http.Handler, o idemhttp.Options) (*idemhttp.Middleware, string) {
	t.Helper()
	if o.Scope == nil {
		o.Scope = scAuthScope
	}
	if o.Namespace == "" {
		o.Namespace = fmt.Sprintf("adv-%d", testNamespaceSeq.Add(1))
	}
	if o.PurgeInterval == 0 {
		o.PurgeInterval = -1
	}
	if o.Logger == nil {
		o.Logger = scQuietLogger()
	}
	m, err := idemhttp.New(store, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	srv := httptest.NewServer(m.Wrap(h))
	t.Cleanup(srv.Close)
	return m, srv.URL
}

func advPost(t *testing.T, url, key, body string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer a")
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(idemhttp.HeaderIdempotencyKey, key)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return resp, string(b)
}

// TestAdvTrailersReachFirstClient: a handler's response trailers reach the
// client of the first (executing) request, as without the middleware.
func TestAdvTrailersReachFirstClient(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, env testStoreEnv) {
		var n atomic.Int64
		_, u := advServer(t, env.store, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n.Add(1)
			w.Header().Set("Trailer", "X-Sum")
			w.WriteHeader(201)
			io.WriteString(w, "body")
			w.Header().Set("X-Sum", "abc")
			w.Header().Set(http.TrailerPrefix+"X-Late", "late")
		}), idemhttp.Options{})
		resp, body := advPost(t, u, `"t1"`, `{}`, nil)
		if resp.StatusCode != 201 || body != "body" {
			t.Fatalf("got %d %q", resp.StatusCode, body)
		}
		if got := resp.Trailer.Get("X-Sum"); got != "abc" {
			t.Errorf("trailer X-Sum = %q, want abc (trailer: %v, header: %v)", got, resp.Trailer, resp.Header)
		}
		if got := resp.Trailer.Get("X-Late"); got != "late" {
			t.Errorf("trailer X-Late = %q, want late", got)
		}
		resp, body = advPost(t, u, `"t1"`, `{}`, nil)
		if resp.StatusCode != 201 || body != "body" || resp.Header.Get(idemhttp.HeaderReplayed) != "true" || n.Load() != 1 {
			t.Fatalf("replay: %d %q %v n=%d", resp.StatusCode, body, resp.Header, n.Load())
		}
	})
}

// TestAdvMethodOverrideInFingerprint: a method-override header changes
// what the request does, so the same key with another override is a
// reused key (422), not a replay of the other operation.
func TestAdvMethodOverrideInFingerprint(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	_, u := advServer(t, idem.NewMemoryStore(nil), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		fmt.Fprintf(w, "did %s", r.Header.Get("X-HTTP-Method-Override"))
	}), idemhttp.Options{})
	resp, body := advPost(t, u, `"m1"`, `{}`, map[string]string{"X-HTTP-Method-Override": "PATCH"})
	if resp.StatusCode != 200 || body != "did PATCH" {
		t.Fatalf("first: %d %q", resp.StatusCode, body)
	}
	resp, body = advPost(t, u, `"m1"`, `{}`, map[string]string{"X-HTTP-Method-Override": "DELETE"})
	if resp.StatusCode != 422 {
		t.Fatalf("DELETE override with the PATCH override's key: %d %q, want 422", resp.StatusCode, body)
	}
}

// TestAdvProxyTrailers: upstream trailers reach the first client as
// trailers and are never replayed as ordinary headers.
func TestAdvProxyTrailers(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	up.set(func(n int64, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Trailer", "X-Sum")
		w.WriteHeader(201)
		io.WriteString(w, "body")
		w.Header().Set("X-Sum", "abc")
	})
	f := newProxies(t, testStoreEnv{store: idem.NewMemoryStore(nil)}, up.URL, 1, nil)[0]
	for i := range 2 {
		req, _ := http.NewRequest(http.MethodPost, f.srv.URL+"/x", strings.NewReader(`{}`))
		req.Header.Set("Authorization", "Bearer a")
		req.Header.Set(idemhttp.HeaderIdempotencyKey, `"tr"`)
		resp, err := f.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 201 || string(b) != "body" {
			t.Fatalf("%d: %d %q", i, resp.StatusCode, b)
		}
		if v := resp.Header.Get("X-Sum"); v != "" {
			t.Errorf("request %d: trailer X-Sum replayed/sent as a header (%q)", i, v)
		}
		if i == 0 && resp.Trailer.Get("X-Sum") != "abc" {
			t.Errorf("first response: trailer X-Sum = %q, want abc", resp.Trailer.Get("X-Sum"))
		}
	}
	if up.n.Load() != 1 {
		t.Fatalf("upstream n=%d", up.n.Load())
	}
}

// TestAdvProxyLargeResponseStreams: a 200 MB upstream response through
// the proxy with a 1 MiB cap streams to the client (the heap does not
// grow with it); the record is completed-not-replayable and the retry
// never reaches upstream. Not parallel, so the heap measurement is its own.
func TestAdvProxyLargeResponseStreams(t *testing.T) {
	size := int64(200 << 20)
	if testing.Short() {
		size = 32 << 20
	}
	up := newUpstream(t)
	up.set(func(n int64, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(200)
		io.Copy(w, &patternReader{left: size})
	})
	f := newProxies(t, testStoreEnv{store: idem.NewMemoryStore(nil)}, up.URL, 1,
		&idemhttp.ProxyOptions{Options: idemhttp.Options{MaxResponseBytes: 1 << 20}})[0]
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	var peak atomic.Uint64
	stop, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				if ms.HeapInuse > peak.Load() {
					peak.Store(ms.HeapInuse)
				}
			}
		}
	}()
	req, _ := http.NewRequest(http.MethodPost, f.srv.URL+"/x", strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer alice")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idemhttp.HeaderIdempotencyKey, `"big"`)
	resp, err := f.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	close(stop)
	<-sampled
	if err != nil || got != size || resp.StatusCode != 200 {
		t.Fatalf("first: %d, %d bytes, %v", resp.StatusCode, got, err)
	}
	growth := int64(peak.Load()) - int64(base.HeapInuse)
	t.Logf("%d MiB through the proxy; heap in use grew by at most %.1f MiB", size>>20, float64(growth)/(1<<20))
	if growth > 32<<20 {
		t.Fatalf("heap grew by %d MiB for a %d MiB response", growth>>20, size>>20)
	}
	r := f.post(t, `"big"`, `{}`)
	if r.status != http.StatusGone || r.problemType() != idemhttp.ProblemReplayUnavailable || up.n.Load() != 1 {
		t.Fatalf("retry: %d %q, upstream n=%d", r.status, r.problemType(), up.n.Load())
	}
}

// noRenewStore is a store whose renewals never arrive (a partition between
// this instance and the store): leases run out while handlers run.
type noRenewStore struct{ idemdriver.LeaseStore }

func (noRenewStore) Renew(context.Context, *idemdriver.RenewParams) error { return errInjected }

// TestAdvStaleAttemptNeverCompletes: attempt 1 loses its lease while its
// handler runs (renewals fail), attempt 2 takes the key over and
// completes; attempt 1's late response must not overwrite it: the replay
// is attempt 2's, and attempt 1's client is told to retry.
func TestAdvStaleAttemptNeverCompletes(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, env testStoreEnv) {
		var n atomic.Int64
		release1 := make(chan struct{})
		started1 := make(chan struct{})
		_, u := advServer(t, noRenewStore{env.store}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			i := n.Add(1)
			if i == 1 {
				close(started1)
				select { // ignores its context, as many handlers do
				case <-release1:
				case <-time.After(60 * time.Second):
				}
			}
			w.WriteHeader(201)
			fmt.Fprintf(w, "attempt %d", i)
		}), idemhttp.Options{Lease: 500 * time.Millisecond})
		first := make(chan string, 1)
		go func() {
			req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(`{}`))
			req.Header.Set("Authorization", "Bearer a")
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(idemhttp.HeaderIdempotencyKey, `"lost"`)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				first <- err.Error()
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			first <- fmt.Sprintf("%d %s", resp.StatusCode, b)
		}()
		<-started1
		deadline := time.Now().Add(30 * time.Second)
		var resp *http.Response
		var body string
		for {
			resp, body = advPost(t, u, `"lost"`, `{}`, nil)
			if resp.StatusCode != http.StatusConflict || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if resp.StatusCode != 201 || body != "attempt 2" {
			t.Fatalf("takeover: %d %q", resp.StatusCode, body)
		}
		close(release1)
		got1 := <-first
		if strings.HasPrefix(got1, "2") {
			t.Errorf("the stale attempt's client got a success: %q", got1)
		}
		resp, body = advPost(t, u, `"lost"`, `{}`, nil)
		if resp.StatusCode != 201 || body != "attempt 2" || resp.Header.Get(idemhttp.HeaderReplayed) != "true" {
			t.Fatalf("replay after the stale attempt returned: %d %q (first client got %q)", resp.StatusCode, body, got1)
		}
		if n.Load() != 2 {
			t.Fatalf("n=%d", n.Load())
		}
	})
}

// TestAdvWrongContentLength: a handler that declares a Content-Length
// shorter than what it writes: the first client gets what net/http sends
// (the declared bytes), and the replay must be the same body, not the
// bytes the client never got.
func TestAdvWrongContentLength(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	var werr atomic.Value
	_, u := advServer(t, idem.NewMemoryStore(nil), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("Content-Length", "3")
		w.WriteHeader(201)
		io.WriteString(w, "hel")
		if _, err := io.WriteString(w, "lo"); err != nil {
			werr.Store(err)
		}
	}), idemhttp.Options{})
	resp1, b1 := advPost(t, u, `"cl"`, `{}`, nil)
	resp2, b2 := advPost(t, u, `"cl"`, `{}`, nil)
	if resp1.StatusCode != 201 || resp2.StatusCode != 201 || b1 != b2 || n.Load() != 1 {
		t.Fatalf("first %d %q, replay %d %q (n=%d): the replay differs from what the first client got",
			resp1.StatusCode, b1, resp2.StatusCode, b2, n.Load())
	}
	if werr.Load() == nil {
		t.Errorf("the handler's write past its Content-Length succeeded (net/http returns http.ErrContentLength)")
	}
}

// TestAdvNoBodyStatuses: 204 and 304 responses replay without a body and
// 1xx informational responses reach the client without being stored.
func TestAdvNoBodyStatuses(t *testing.T) {
	t.Parallel()
	for _, code := range []int{204, 304} {
		var n atomic.Int64
		_, u := advServer(t, idem.NewMemoryStore(nil), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n.Add(1)
			w.Header().Set("ETag", `"v1"`)
			w.Header().Set("Link", "</a>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			w.WriteHeader(code)
			io.WriteString(w, "ignored")
		}), idemhttp.Options{})
		for i := range 3 {
			resp, b := advPost(t, u, `"nb"`, `{}`, nil)
			if resp.StatusCode != code || b != "" || resp.Header.Get("ETag") != `"v1"` {
				t.Fatalf("%d #%d: %d %q %v", code, i, resp.StatusCode, b, resp.Header)
			}
			if i > 0 && resp.Header.Get(idemhttp.HeaderReplayed) != "true" {
				t.Fatalf("%d #%d not replayed", code, i)
			}
		}
		if n.Load() != 1 {
			t.Fatalf("n=%d", n.Load())
		}
	}
}

// TestAdvNoBodyStatusesRaw: on the wire, a replayed 204 carries no
// Content-Length and no body (RFC 9110 section 8.6), as the first one.
func TestAdvNoBodyStatusesRaw(t *testing.T) {
	t.Parallel()
	_, u := advServer(t, idem.NewMemoryStore(nil), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(204)
		io.WriteString(w, "ignored")
	}), idemhttp.Options{})
	for i := range 2 {
		conn, err := net.Dial("tcp", strings.TrimPrefix(u, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nAuthorization: a\r\nIdempotency-Key: \"raw\"\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
		raw, _ := io.ReadAll(conn)
		conn.Close()
		if strings.Contains(strings.ToLower(string(raw)), "content-length") || strings.Contains(string(raw), "ignored") {
			t.Fatalf("response %d:\n%s", i, raw)
		}
	}
}

// TestAdvWriteAfterReturn: a handler's goroutine that writes after the
// handler returned gets an error; its bytes are neither sent nor stored
// (net/http forbids such writes; through the middleware they would reach
// a finished response).
func TestAdvWriteAfterReturn(t *testing.T) {
	t.Parallel()
	late := make(chan struct{})
	lateErr := make(chan error, 1)
	_, u := advServer(t, idem.NewMemoryStore(nil), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(201)
		io.WriteString(w, "in time")
		go func() {
			<-late
			_, err := io.WriteString(w, " late")
			lateErr <- err
		}()
	}), idemhttp.Options{})
	_, b1 := advPost(t, u, `"late"`, `{}`, nil)
	close(late)
	if err := <-lateErr; err == nil {
		t.Errorf("a write after the handler returned succeeded")
	}
	_, b2 := advPost(t, u, `"late"`, `{}`, nil)
	if b1 != "in time" || b2 != "in time" {
		t.Fatalf("first %q, replay %q", b1, b2)
	}
}

// TestAdv101WithoutHijack: a handler that answers 101 Switching Protocols
// without a hijack leaves no record that every later retry finds corrupt:
// the key is released, as for a refused Hijack.
func TestAdv101WithoutHijack(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	_, u := advServer(t, idem.NewMemoryStore(nil), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			w.Header().Set("Upgrade", "websocket")
			w.WriteHeader(http.StatusSwitchingProtocols)
			return
		}
		w.WriteHeader(201)
	}), idemhttp.Options{})
	req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer a")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idemhttp.HeaderIdempotencyKey, `"up"`)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
	}
	resp, body := advPost(t, u, `"up"`, `{}`, nil)
	if resp.StatusCode != 201 || n.Load() != 2 {
		t.Fatalf("retry after a 101: %d %q, n=%d; want the key released (201, n=2)", resp.StatusCode, body, n.Load())
	}
}

// TestAdvOddKeys: keys that differ only by case, escapes, separators or
// beyond the inline length are distinct records on every store; each
// replays its own response. Malformed ones are 400 and run nothing.
func TestAdvOddKeys(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, env testStoreEnv) {
		var n atomic.Int64
		_, u := advServer(t, env.store, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(201)
			fmt.Fprintf(w, "%d", n.Add(1))
		}), idemhttp.Options{})
		long := func(c byte, l int) string { return `"` + strings.Repeat(string(c), l) + `"` }
		keys := []string{`"K"`, `"k"`, `"a\"b"`, `"a\\b"`, `"a:b"`, `"a!b"`, `" sp "`, `"sp"`,
			long('x', 232), long('x', 233), long('x', 255), long('y', 233),
			`"` + strings.Repeat("x", 231) + `!"`, `"` + strings.Repeat("x", 254) + `y"`}
		got := map[string]string{}
		for _, k := range keys {
			resp, b := advPost(t, u, k, `{}`, nil)
			if resp.StatusCode != 201 {
				t.Fatalf("key %s: %d %s", k, resp.StatusCode, b)
			}
			got[k] = b
		}
		if n.Load() != int64(len(keys)) {
			t.Fatalf("n=%d for %d distinct keys", n.Load(), len(keys))
		}
		for _, k := range keys {
			resp, b := advPost(t, u, k, `{}`, nil)
			if resp.StatusCode != 201 || b != got[k] || resp.Header.Get(idemhttp.HeaderReplayed) != "true" {
				t.Fatalf("key %s: replay %d %q, want %q", k, resp.StatusCode, b, got[k])
			}
		}
		for _, bad := range []string{`"a";b=`, "\"\xc3\xa9\"", long('x', 256), `"a", "b"`, `"a" ;b`, `""`, "\" \"", `"a\b"`, `"unterminated`} {
			resp, b := advPost(t, u, bad, `{}`, nil)
			if resp.StatusCode != 400 {
				t.Fatalf("key %q: %d %s, want 400", bad, resp.StatusCode, b)
			}
		}
		if n.Load() != int64(len(keys)) {
			t.Fatalf("a malformed key ran the handler: n=%d", n.Load())
		}
	})
}

// TestAdvProxyUnkeyedBodyTooLarge: an unkeyed request over the proxy's
// MaxRequestBytes (passed through without idempotency) is refused with
// 413, not forwarded truncated and answered 502.
func TestAdvProxyUnkeyedBodyTooLarge(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	var gotLen atomic.Int64
	up.set(func(n int64, w http.ResponseWriter, r *http.Request) {
		gotLen.Store(-1)
		w.WriteHeader(201)
	})
	f := newProxies(t, testStoreEnv{store: idem.NewMemoryStore(nil)}, up.URL, 1,
		&idemhttp.ProxyOptions{Options: idemhttp.Options{MaxRequestBytes: 1 << 10}})[0]
	for _, chunked := range []bool{false, true} {
		var body io.Reader = strings.NewReader(strings.Repeat("x", 4<<10))
		if chunked {
			body = io.MultiReader(body) // no length: chunked
		}
		req, _ := http.NewRequest(http.MethodPost, f.srv.URL+"/x", body)
		req.Header.Set("Authorization", "Bearer a")
		resp, err := f.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("chunked=%v: %d %s, want 413 (upstream n=%d)", chunked, resp.StatusCode, b, up.n.Load())
		}
	}
}

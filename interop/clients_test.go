package interop

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v85"

	"github.com/idem-go/idem/internal/testenv"
)

// front is a reverse proxy in front of `idem proxy` that counts the
// attempts a client makes, per Idempotency-Key.
type front struct {
	*httptest.Server
	mu       sync.Mutex
	attempts map[string]int
}

func newFront(t *testing.T, target string) *front {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	f := &front{attempts: map[string]int{}}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ErrorLog = log.New(io.Discard, "", 0) // clients that time out
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.attempts[r.Header.Get("Idempotency-Key")]++
		f.mu.Unlock()
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *front) count(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.attempts[key]
}

// keys returns the keys the front saw.
func (f *front) keys() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ks []string
	for k := range f.attempts {
		ks = append(ks, k)
	}
	return ks
}

// slowFirst makes a key's first request answer after d.
func slowFirst(d time.Duration) func(string) (<-chan struct{}, int) {
	return func(string) (<-chan struct{}, int) {
		c := make(chan struct{})
		time.AfterFunc(d, func() { close(c) })
		return c, 0
	}
}

// clientStack is an upstream, `idem proxy` on SQLite in front of it,
// and a counting front.
func clientStack(t *testing.T, up *upstream) *front {
	p := startProxy(t, "--upstream", up.URL, "--store", "sqlite:"+filepath.Join(t.TempDir(), "proxy.db"), "--lease", "2s")
	return newFront(t, p.URL)
}

func stripeClient(base string, timeout time.Duration, retries int64) *stripe.Client {
	cfg := &stripe.BackendConfig{
		URL:               stripe.String(base),
		MaxNetworkRetries: stripe.Int64(retries),
		HTTPClient:        &http.Client{Timeout: timeout},
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	}
	return stripe.NewClient("sk_test_interop", stripe.WithBackends(stripe.NewBackendsWithConfig(cfg)))
}

// stripeCustomers makes the upstream answer like Stripe's POST /v1/customers.
func stripeCustomers(r *http.Request, key string, n int) (string, []byte) {
	b, _ := json.Marshal(map[string]any{
		"id": fmt.Sprintf("cus_%s_%d", key, n), "object": "customer",
		"name": r.PostForm.Get("name"), "livemode": false,
	})
	return "application/json", b
}

// TestStripeGoRetriesThroughProxy: stripe-go's first attempt times out
// while the upstream works; its retries (same Idempotency-Key, set by
// stripe-go) get 409 in progress, then the stored customer.
func TestStripeGoRetriesThroughProxy(t *testing.T) {
	up := newUpstream(t)
	up.first = slowFirst(1500 * time.Millisecond)
	up.body = func(r *http.Request, key string, n int) (string, []byte) {
		r.ParseForm()
		return stripeCustomers(r, "x", n)
	}
	fr := clientStack(t, up)
	sc := stripeClient(fr.URL, 400*time.Millisecond, 5)

	cus, err := sc.V1Customers.Create(context.Background(), &stripe.CustomerCreateParams{Name: stripe.String("Jenny Rosen")})
	if err != nil {
		t.Fatalf("stripe-go Create: %v", err)
	}
	keys := fr.keys()
	if len(keys) != 1 || keys[0] == "" {
		t.Fatalf("stripe-go used keys %q, want one", keys)
	}
	key := keys[0]
	reqs, execs := up.counts(key)
	t.Logf("stripe-go: customer %s; attempts at the proxy %d; upstream requests %d, executions %d; replayed=%q",
		cus.ID, fr.count(key), reqs, execs, cus.LastResponse.Header.Get("Idempotent-Replayed"))
	if cus.ID != "cus_x_1" || cus.Name != "Jenny Rosen" {
		t.Errorf("customer %+v, want cus_x_1 Jenny Rosen", cus)
	}
	if fr.count(key) < 2 {
		t.Errorf("stripe-go made %d attempts, want a retry after the timeout", fr.count(key))
	}
	if reqs != 1 || execs != 1 {
		t.Errorf("upstream ran the key %d times (%d requests), want once", execs, reqs)
	}
	if cus.LastResponse.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the answer stripe-go kept is not the replay")
	}
}

// TestStripeGoKeyReused: the key of a completed request sent again with
// another body gets 422 idempotency-key-reused with Stripe-Should-Retry:
// false. stripe-go checks that header only for errors it can parse as
// Stripe errors ({"error": {...}}); the proxy's problem+json is not one,
// and stripe-go retries every other error, so it makes 1+MaxNetworkRetries
// attempts. None reaches the upstream.
func TestStripeGoKeyReused(t *testing.T) {
	up := newUpstream(t)
	up.body = func(r *http.Request, key string, n int) (string, []byte) {
		r.ParseForm()
		return stripeCustomers(r, "y", n)
	}
	fr := clientStack(t, up)
	sc := stripeClient(fr.URL, 5*time.Second, 2)
	key := "stripe-reuse-" + uniq()
	p := &stripe.CustomerCreateParams{Name: stripe.String("A")}
	p.SetIdempotencyKey(key)
	if _, err := sc.V1Customers.Create(context.Background(), p); err != nil {
		t.Fatalf("first Create: %v", err)
	}
	p2 := &stripe.CustomerCreateParams{Name: stripe.String("B")}
	p2.SetIdempotencyKey(key)
	start := time.Now()
	_, err := sc.V1Customers.Create(context.Background(), p2)
	attempts := fr.count(key) - 1
	t.Logf("stripe-go, key reused with another body: %d attempts in %v, error %v", attempts, time.Since(start).Round(time.Millisecond), err)
	var se *stripe.Error
	if err == nil || errors.As(err, &se) {
		t.Errorf("error %v (%T): want the proxy's problem as a plain error", err, err)
	}
	if attempts != 1+2 {
		t.Errorf("stripe-go made %d attempts with the reused key, want 1+MaxNetworkRetries = 3 (it retries non-Stripe errors)", attempts)
	}
	if reqs, execs := up.counts(key); reqs != 1 || execs != 1 {
		t.Errorf("upstream saw the key %d times (%d executions), want once", reqs, execs)
	}
}

// python returns a python3 with urllib3, preferring Debian's.
func python(t *testing.T) string {
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if path, err := exec.LookPath(p); err == nil && exec.Command(path, "-c", "import urllib3").Run() == nil {
			return path
		}
	}
	if testenv.Required() {
		t.Fatalf("python3 with urllib3 not found (required: %s=1); scripts/services installs python3-urllib3", testenv.RequireAllEnv)
	}
	t.Skip("python3 with urllib3 not found (Debian: python3-urllib3)")
	return ""
}

type pyResult struct {
	Urllib3  string `json:"urllib3"`
	Status   int    `json:"status"`
	Body     string `json:"body"`
	Replayed string `json:"replayed"`
	History  []struct {
		Status int    `json:"status"`
		Error  string `json:"error"`
	} `json:"history"`
	Error string `json:"error"`
}

func runPython(t *testing.T, py, url, key, body string, readTimeout time.Duration) pyResult {
	t.Helper()
	out, err := exec.Command(py, filepath.Join("testdata", "urllib3_post.py"), url, key, body,
		fmt.Sprint(readTimeout.Seconds())).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("urllib3_post.py: %v: %s", err, ee.Stderr)
		}
		t.Fatal(err)
	}
	var r pyResult
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("urllib3_post.py printed %q: %v", out, err)
	}
	return r
}

// TestURLLib3RetriesThroughProxy drives urllib3's Retry (POST allowed,
// status_forcelist 409/429/500/502/503) through `idem proxy`.
func TestURLLib3RetriesThroughProxy(t *testing.T) {
	py := python(t)
	if _, err := os.Stat(filepath.Join("testdata", "urllib3_post.py")); err != nil {
		t.Fatal(err)
	}
	up := newUpstream(t)
	unavailable := "py-503-" + uniq()
	slow := "py-timeout-" + uniq()
	up.first = func(key string) (<-chan struct{}, int) {
		switch key {
		case unavailable:
			return nil, http.StatusServiceUnavailable
		case slow:
			return slowFirst(1200 * time.Millisecond)(key)
		}
		return nil, 0
	}
	fr := clientStack(t, up)
	target := fr.URL + "/things"

	t.Run("first-attempt-503", func(t *testing.T) {
		r := runPython(t, py, target, unavailable, `{"n":1}`, 5*time.Second)
		reqs, execs := up.counts(unavailable)
		t.Logf("urllib3 %s: %d %s; history %+v; attempts %d; upstream requests %d, executions %d", r.Urllib3, r.Status, r.Error, r.History, fr.count(unavailable), reqs, execs)
		if r.Status != http.StatusCreated || len(r.History) != 1 || r.History[0].Status != http.StatusServiceUnavailable {
			t.Errorf("got %+v, want 201 after one retry of a 503", r)
		}
		if reqs != 2 || execs != 1 {
			t.Errorf("upstream: %d requests, %d executions; want the released 503 and one execution", reqs, execs)
		}
	})
	t.Run("first-attempt-timeout", func(t *testing.T) {
		r := runPython(t, py, target, slow, `{"n":2}`, 300*time.Millisecond)
		reqs, execs := up.counts(slow)
		t.Logf("urllib3 %s: %d %s replayed=%q; history %+v; attempts %d; upstream requests %d, executions %d", r.Urllib3, r.Status, r.Error, r.Replayed, r.History, fr.count(slow), reqs, execs)
		if r.Status != http.StatusCreated || r.Replayed != "true" || len(r.History) < 2 {
			t.Errorf("got %+v, want the replayed 201 after a read timeout and 409s", r)
		}
		if reqs != 1 || execs != 1 {
			t.Errorf("upstream: %d requests, %d executions; want one", reqs, execs)
		}
	})
	t.Run("422-key-reused", func(t *testing.T) {
		key := "py-reuse-" + uniq()
		if r := runPython(t, py, target, key, `{"n":3}`, 5*time.Second); r.Status != http.StatusCreated {
			t.Fatalf("first request: %+v", r)
		}
		r := runPython(t, py, target, key, `{"n":4}`, 5*time.Second)
		t.Logf("urllib3: %d; history %+v; attempts %d", r.Status, r.History, fr.count(key))
		if r.Status != http.StatusUnprocessableEntity || len(r.History) != 0 || fr.count(key) != 2 {
			t.Errorf("got %+v after %d attempts, want 422 without a retry", r, fr.count(key))
		}
		if reqs, _ := up.counts(key); reqs != 1 {
			t.Errorf("upstream saw the key %d times, want once", reqs)
		}
	})
	t.Run("400-key-invalid", func(t *testing.T) {
		key := fmt.Sprintf("%0300d", 1) // longer than a key may be
		r := runPython(t, py, target, key, `{"n":5}`, 5*time.Second)
		t.Logf("urllib3: %d; history %+v; attempts %d", r.Status, r.History, fr.count(key))
		if r.Status != http.StatusBadRequest || len(r.History) != 0 || fr.count(key) != 1 {
			t.Errorf("got %+v after %d attempts, want 400 without a retry", r, fr.count(key))
		}
		if reqs, _ := up.counts(key); reqs != 0 {
			t.Errorf("upstream saw the invalid key %d times", reqs)
		}
	})
}

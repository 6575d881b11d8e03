package console_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/idemdriver"
)

var errBoom = errors.New("charge declined")

// poisoned processes id on a LeaseConsumer of store with MaxAttempts 1
// and a failing handler, leaving a failed record; it returns the consumer
// and a handler that succeeds, counting its runs.
func poisoned(t *testing.T, store idemdriver.LeaseStore, name string, ids ...string) (*idem.LeaseConsumer, func() int) {
	t.Helper()
	c, err := idem.NewLeaseConsumer(store, idem.Config{Name: name, MaxAttempts: 1, PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	for _, id := range ids {
		out, _ := c.Process(t.Context(), idem.Message{ID: id, Payload: []byte("p-" + id)}, func(context.Context, *idem.Attempt) (idem.Result, error) {
			return idem.Result{}, errBoom
		})
		if !out.Poison {
			t.Fatalf("message %s: outcome %+v, want poison", id, out)
		}
	}
	runs := 0
	return c, func() int {
		for _, id := range ids {
			_, _ = c.Process(t.Context(), idem.Message{ID: id, Payload: []byte("p-" + id)}, func(context.Context, *idem.Attempt) (idem.Result, error) {
				runs++
				return idem.Result{Body: []byte("ok")}, nil
			})
		}
		return runs
	}
}

type fixture struct {
	t      *testing.T
	srv    *httptest.Server
	client *http.Client
	log    *bytes.Buffer
	reg    *prometheus.Registry
}

func newFixture(t *testing.T, store console.Store, cfg console.Config) *fixture {
	t.Helper()
	f := &fixture{t: t, log: &bytes.Buffer{}, reg: prometheus.NewRegistry()}
	cfg.Store, cfg.Where = store, "test store"
	cfg.Logger = slog.New(slog.NewJSONHandler(f.log, nil))
	cfg.Registerer = f.reg
	s, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.srv = httptest.NewServer(s)
	t.Cleanup(f.srv.Close)
	jar, _ := cookiejar.New(nil)
	f.client = &http.Client{Jar: jar}
	return f
}

func (f *fixture) get(path string) (int, string, http.Header) {
	f.t.Helper()
	resp, err := f.client.Get(f.srv.URL + path)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

func (f *fixture) post(path string, form url.Values) (int, string) {
	f.t.Helper()
	resp, err := f.client.PostForm(f.srv.URL+path, form)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

var hidden = regexp.MustCompile(`name="([a-z_]+)" value="([^"]*)"`)

// confirmForm loads the confirm page of query and returns its form.
func (f *fixture) confirmForm(query string) url.Values {
	f.t.Helper()
	code, body, _ := f.get("/confirm?" + query)
	if code != http.StatusOK {
		f.t.Fatalf("confirm page: %d %s", code, body)
	}
	form := url.Values{}
	for _, m := range hidden.FindAllStringSubmatch(body, -1) {
		form.Set(m[1], strings.ReplaceAll(m[2], "&#34;", `"`))
	}
	return form
}

func TestPagesAndRetryOnce(t *testing.T) {
	store := idem.NewMemoryStore(nil)
	_, reprocess := poisoned(t, store, "payments", "pay-1", "pay-2")
	f := newFixture(t, store, console.Config{})

	code, body, h := f.get("/consumers")
	if code != 200 || !strings.Contains(body, "payments") {
		t.Fatalf("consumers page: %d %s", code, body)
	}
	if h.Get("Content-Security-Policy") != console.CSP || h.Get("X-Frame-Options") != "DENY" {
		t.Errorf("headers: %v", h)
	}
	if strings.Contains(body, "<script") || strings.Contains(body, "style=") {
		t.Errorf("a page has a script or an inline style: %s", body)
	}
	var cons console.ConsumersView
	_, js, _ := f.get("/api/consumers")
	if err := json.Unmarshal([]byte(js), &cons); err != nil || len(cons.Consumers) != 1 || cons.Consumers[0].Oldest == nil {
		t.Errorf("api/consumers: %s (%v)", js, err)
	}
	var page console.RecordPageView
	_, js, _ = f.get("/api/failed?consumer=payments")
	if err := json.Unmarshal([]byte(js), &page); err != nil || len(page.Records) != 2 || page.Records[0].Error == "" {
		t.Fatalf("api/failed: %s (%v)", js, err)
	}
	if code, _, _ := f.get("/api/failed?consumer=payments&limit=10&scan=5"); code != http.StatusBadRequest {
		t.Errorf("scan below limit: %d, want 400", code)
	}
	if code, body, _ := f.get("/failed?consumer=payments"); code != 200 || !strings.Contains(body, "charge declined") || !strings.Contains(body, "/confirm?action=retry") {
		t.Errorf("failed page: %d %s", code, body)
	}
	if code, body, _ := f.get("/message?consumer=payments&id=pay-1"); code != 200 || !strings.Contains(body, "failed") {
		t.Errorf("message page: %d %s", code, body)
	}
	var msg console.MessageView
	if _, js, _ := f.get("/api/message?consumer=payments&id=pay-1"); json.Unmarshal([]byte(js), &msg) != nil || msg.State != "failed" || msg.Steps == nil {
		t.Errorf("api/message: %s", js)
	}
	if code, _, _ := f.get("/message?consumer=payments&id=nope"); code != http.StatusNotFound {
		t.Errorf("message page of a missing record: %d, want 404", code)
	}

	form := f.confirmForm("action=retry&consumer=payments&id=pay-1")
	// Without the CSRF token, or with another, nothing runs.
	bad := url.Values{}
	for k, v := range form {
		bad[k] = v
	}
	bad.Set("csrf", strings.Repeat("0", 64))
	if code, _ := f.post("/action", bad); code != http.StatusForbidden {
		t.Errorf("action with a wrong CSRF token: %d, want 403", code)
	}
	for i := range 2 { // a double submit
		code, body := f.post("/action", form)
		if code != 200 || !strings.Contains(body, "retryable") {
			t.Fatalf("submit %d: %d %s", i, code, body)
		}
	}
	if got := testutil.ToFloat64(mustCounter(t, f.reg, "retry", "changed")); got != 1 {
		t.Errorf("changed retries counted %v, want 1", got)
	}
	// A second confirmation of the same retry acts, and changes nothing.
	code, body = f.post("/action", f.confirmForm("action=retry&consumer=payments&id=pay-1"))
	if code != 200 || !strings.Contains(body, "nothing changed") {
		t.Errorf("second confirmation: %d %s", code, body)
	}
	if n := reprocess(); n != 1 {
		t.Errorf("handler ran %d times after the retry, want 1 (pay-1 alone; pay-2 is still poisoned)", n)
	}
	// Retry of the completed record is refused.
	code, body = f.post("/action", f.confirmForm("action=retry&consumer=payments&id=pay-1"))
	if code != http.StatusConflict || !strings.Contains(body, "only a failed record") {
		t.Errorf("retry of a completed record: %d %s", code, body)
	}
	if !strings.Contains(f.log.String(), `"action":"retry"`) || !strings.Contains(f.log.String(), `"result":"changed"`) {
		t.Errorf("audit log: %s", f.log.String())
	}
	if code, _ := f.post("/action", url.Values{"action": {"retry"}}); code != http.StatusForbidden {
		t.Errorf("action without CSRF: %d, want 403", code)
	}
}

func mustCounter(t *testing.T, reg *prometheus.Registry, action, result string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if mf.GetName() == "idem_console_actions_total" && labels["action"] == action && labels["result"] == result {
				return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "x"}, func() float64 { return m.GetCounter().GetValue() })
			}
		}
	}
	t.Fatalf("no idem_console_actions_total{action=%q,result=%q}", action, result)
	return nil
}

func TestReleaseStuckLease(t *testing.T) {
	store := idem.NewMemoryStore(nil)
	c, err := idem.NewLeaseConsumer(store, idem.Config{Name: "mail", PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a, _, err := c.Acquire(t.Context(), idem.Message{ID: "m-1", Payload: []byte("x")}, idem.AcquireOptions{})
	if err != nil || a == nil {
		t.Fatalf("Acquire: %v", err)
	}
	if _, err := a.Step(t.Context(), "send", func(context.Context) ([]byte, error) { return []byte("msg_secret_id"), nil }); err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, store, console.Config{})
	if _, body, _ := f.get("/message?consumer=mail&id=m-1"); !strings.Contains(body, "13 bytes (hidden)") || strings.Contains(body, "msg_secret_id") {
		t.Errorf("message page without ShowPayloads: %s", body)
	}
	shown := newFixture(t, store, console.Config{ShowPayloads: true})
	if _, body, _ := shown.get("/message?consumer=mail&id=m-1"); !strings.Contains(body, "msg_secret_id") {
		t.Errorf("message page with ShowPayloads: %s", body)
	}
	_, body, _ := f.get("/failed?consumer=mail&state=in_progress")
	if !strings.Contains(body, "/confirm?action=release") || !strings.Contains(body, "live until") {
		t.Fatalf("in-progress page: %s", body)
	}
	code, body := f.post("/action", f.confirmForm("action=release&consumer=mail&id=m-1&token=1"))
	if code != 200 || !strings.Contains(body, "released the lease of token 1") {
		t.Fatalf("release: %d %s", code, body)
	}
	if _, err := a.Complete(t.Context(), idem.Result{}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Errorf("the released holder's Complete: %v, want ErrLeaseLost", err)
	}
	code, body = f.post("/action", f.confirmForm("action=release&consumer=mail&id=m-1&token=9"))
	if code != http.StatusConflict {
		t.Errorf("release of a token never held: %d %s", code, body)
	}
}

func TestReadOnlyTokenAndPayloads(t *testing.T) {
	store := idem.NewMemoryStore(nil)
	poisoned(t, store, "payments", "pay-1")
	f := newFixture(t, store, console.Config{ReadOnly: true})
	if _, body, _ := f.get("/failed?consumer=payments"); strings.Contains(body, "/confirm") {
		t.Errorf("read-only page offers an action: %s", body)
	}
	if code, _, _ := f.get("/confirm?action=retry&consumer=payments&id=pay-1"); code != http.StatusNotFound {
		t.Errorf("read-only confirm: %d, want 404", code)
	}
	if code, _ := f.post("/action", url.Values{"action": {"retry"}, "consumer": {"payments"}, "id": {"pay-1"}}); code != http.StatusNotFound && code != http.StatusMethodNotAllowed {
		t.Errorf("read-only action: %d, want 404 or 405", code)
	}

	tok := newFixture(t, store, console.Config{Token: "s3cret-token"})
	if code, body, _ := tok.get("/api/consumers"); code != http.StatusUnauthorized || strings.Contains(body, "payments") {
		t.Errorf("no token: %d %s", code, body)
	}
	if code, body := tok.post("/login", url.Values{"token": {"wrong"}}); code != http.StatusUnauthorized || strings.Contains(body, "s3cret") {
		t.Errorf("wrong token: %d", code)
	}
	if code, body := tok.post("/login", url.Values{"token": {"s3cret-token"}}); code != 200 || !strings.Contains(body, "payments") {
		t.Errorf("after signing in: %d %s", code, body)
	}
	req, _ := http.NewRequest("GET", tok.srv.URL+"/api/failed?consumer=payments", nil)
	req.Header.Set("Authorization", "Bearer s3cret-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Errorf("bearer: %v %v", resp, err)
	}
}

// gated blocks RetryRecord until release is closed, counting calls.
type gated struct {
	*idem.MemoryStore
	entered chan struct{}
	release chan struct{}
	calls   atomic.Int32
}

func (g *gated) RetryRecord(ctx context.Context, consumer, id string) (idemdriver.ActionResult, error) {
	if g.calls.Add(1) == 1 {
		close(g.entered)
	}
	<-g.release
	return g.MemoryStore.RetryRecord(ctx, consumer, id)
}

// One confirmation posted twice at once (a double click) runs the action
// once: the second post waits for the first and answers its result.
func TestConcurrentDoubleSubmit(t *testing.T) {
	mem := idem.NewMemoryStore(nil)
	poisoned(t, mem, "payments", "pay-1")
	g := &gated{MemoryStore: mem, entered: make(chan struct{}), release: make(chan struct{})}
	f := newFixture(t, g, console.Config{})
	form := f.confirmForm("action=retry&consumer=payments&id=pay-1")
	codes := make(chan int, 2)
	post := func() {
		code, _ := f.post("/action", form)
		codes <- code
	}
	go post()
	<-g.entered
	go post()
	close(g.release)
	if a, b := <-codes, <-codes; a != 200 || b != 200 {
		t.Fatalf("statuses %d, %d", a, b)
	}
	if n := g.calls.Load(); n != 1 {
		t.Errorf("RetryRecord ran %d times, want 1", n)
	}
	if got := testutil.ToFloat64(mustCounter(t, f.reg, "retry", "repeated")); got != 1 {
		t.Errorf("repeats counted %v, want 1", got)
	}
}

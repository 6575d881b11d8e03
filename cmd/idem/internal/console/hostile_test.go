package console_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/idemdriver"
)

// do sends a request to f's server with the Host header host.
func (f *fixture) do(method, path, host string, form url.Values) (int, string) {
	f.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, f.srv.URL+path, body)
	if err != nil {
		f.t.Fatal(err)
	}
	req.Host = host
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := f.client.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A console without a token answers only requests addressed to a
// loopback name: a page of another site whose name was rebound to
// 127.0.0.1 (DNS rebinding) is same-origin to the browser, so it could
// otherwise read every page, read a confirm form's CSRF token and post
// it. With a token, the attacker's origin has no session cookie, and the
// Host a reverse proxy forwards is whatever the proxy's name is.
func TestTokenlessConsoleRefusesForeignHost(t *testing.T) {
	store := idem.NewMemoryStore(nil)
	poisoned(t, store, "payments", "pay-1")
	f := newFixture(t, store, console.Config{})
	port := f.srv.URL[strings.LastIndex(f.srv.URL, ":"):]

	for _, host := range []string{"evil.example" + port, "evil.example", "127.0.0.1.evil.example" + port, "localhost.evil.example" + port, "10.0.0.1" + port} {
		if code, body := f.do("GET", "/api/failed?consumer=payments", host, nil); code != http.StatusMisdirectedRequest || strings.Contains(body, "pay-1") {
			t.Errorf("Host %s: %d %s, want 421 and no record", host, code, body)
		}
		if code, body := f.do("GET", "/confirm?action=retry&consumer=payments&id=pay-1", host, nil); code != http.StatusMisdirectedRequest || strings.Contains(body, `name="csrf"`) {
			t.Errorf("Host %s: confirm page %d %s, want 421 and no CSRF token", host, code, body)
		}
	}
	// The rebound page's post, with the form and cookie it would have
	// obtained, runs nothing.
	form := f.confirmForm("action=retry&consumer=payments&id=pay-1")
	if code, _ := f.do("POST", "/action", "evil.example"+port, form); code != http.StatusMisdirectedRequest {
		t.Errorf("foreign Host action: %d, want 421", code)
	}
	rec, err := store.Inspect(t.Context(), "payments", "pay-1")
	if err != nil || rec.State != idemdriver.StateFailed {
		t.Fatalf("after a foreign Host's action: %+v %v, want the record still failed", rec, err)
	}
	for _, host := range []string{"127.0.0.1" + port, "localhost" + port, "LOCALHOST" + port, "[::1]" + port, "127.0.0.2" + port, "localhost"} {
		if code, body := f.do("GET", "/api/failed?consumer=payments", host, nil); code != http.StatusOK || !strings.Contains(body, "pay-1") {
			t.Errorf("Host %s: %d %s, want 200", host, code, body)
		}
	}

	tok := newFixture(t, store, console.Config{Token: "s3cret-token"})
	req, _ := http.NewRequest("GET", tok.srv.URL+"/api/failed?consumer=payments", nil)
	req.Host = "console.internal.example"
	req.Header.Set("Authorization", "Bearer s3cret-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("a token console behind a proxy's name: %d, want 200", resp.StatusCode)
	}
}

// An action key answers repeats of its own action only: the same key
// posted with another target is refused, and that target is left alone
// (it is not answered "acted once" with the first action's result).
func TestActionKeyBoundToItsAction(t *testing.T) {
	store := idem.NewMemoryStore(nil)
	poisoned(t, store, "payments", "pay-1", "pay-2")
	f := newFixture(t, store, console.Config{})
	form := f.confirmForm("action=retry&consumer=payments&id=pay-1")
	if code, body := f.post("/action", form); code != http.StatusOK {
		t.Fatalf("retry: %d %s", code, body)
	}
	form.Set("id", "pay-2")
	if code, body := f.post("/action", form); code != http.StatusBadRequest || strings.Contains(body, "acted once") {
		t.Errorf("the key of pay-1's retry posted for pay-2: %d %s, want 400", code, body)
	}
	for id, want := range map[string]idemdriver.RecordState{"pay-1": idemdriver.StateInProgress, "pay-2": idemdriver.StateFailed} {
		if rec, err := store.Inspect(t.Context(), "payments", id); err != nil || rec.State != want {
			t.Errorf("%s: %v %v, want %v", id, rec.State, err, want)
		}
	}
}

// An action's result shows the record at a time after the action: a
// released lease is over (not "live until" the release's own time), and
// its age is not negative.
func TestActionResultAfterTheAction(t *testing.T) {
	var (
		mu   sync.Mutex
		last = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	)
	// The store's clock moves a millisecond per reading; the console's
	// reads the store's latest time.
	storeNow := func() time.Time { mu.Lock(); defer mu.Unlock(); last = last.Add(time.Millisecond); return last }
	consoleNow := func() time.Time { mu.Lock(); defer mu.Unlock(); return last }
	store := idem.NewMemoryStore(storeNow)
	c, err := idem.NewLeaseConsumer(store, idem.Config{Name: "mail", PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if a, _, err := c.Acquire(t.Context(), idem.Message{ID: "m-1", Payload: []byte("x")}, idem.AcquireOptions{}); err != nil || a == nil {
		t.Fatalf("Acquire: %v", err)
	}
	f := newFixture(t, store, console.Config{Now: consoleNow})
	form := f.confirmForm("action=release&consumer=mail&id=m-1&token=1")
	req, _ := http.NewRequest("POST", f.srv.URL+"/action", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	resp, err := f.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v console.ActionView
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || !v.Changed || v.Record == nil {
		t.Fatalf("release: %d %+v %v", resp.StatusCode, v, err)
	}
	if v.Record.LeaseLive || v.Record.AgeS < 0 {
		t.Errorf("released record: lease live %v, age %vs; want the lease over and an age >= 0", v.Record.LeaseLive, v.Record.AgeS)
	}
}

// The sign-in page, which anyone who reaches the console reads, names
// no store: where the database is stays behind the token.
func TestSignInPageNamesNoStore(t *testing.T) {
	store := idem.NewMemoryStore(nil)
	tok := newFixture(t, store, console.Config{Token: "s3cret-token"})
	for _, path := range []string{"/login", "/consumers"} {
		if code, body, _ := tok.get(path); code != http.StatusOK || strings.Contains(body, "test store") {
			t.Errorf("GET %s without the token: %d, names the store: %v", path, code, strings.Contains(body, "test store"))
		}
	}
	if code, body := tok.post("/login", url.Values{"token": {"wrong"}}); code != http.StatusUnauthorized || strings.Contains(body, "test store") {
		t.Errorf("wrong token: %d, names the store: %v", code, strings.Contains(body, "test store"))
	}
	if code, body := tok.post("/login", url.Values{"token": {"s3cret-token"}}); code != http.StatusOK || !strings.Contains(body, "test store") {
		t.Errorf("signed in: %d, want the store named", code)
	}
}

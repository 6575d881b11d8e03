package console_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idemsql"
)

// clock is a settable clock for the console's Config.Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// A client gets SignInFailures wrong tokens; the next sign-in, even with
// the right token, is refused with 429 and a Retry-After, until the
// oldest failure leaves the window. The session cookie expires: it has a
// Max-Age, and the server refuses it after SessionTTL whatever the
// browser keeps.
func TestSignInLimitAndSessionExpiry(t *testing.T) {
	store := idem.NewMemoryStore(nil)
	poisoned(t, store, "payments", "pay-1")
	clk := &clock{t: time.Date(2026, 12, 6, 1, 0, 0, 0, time.UTC)}
	f := newFixture(t, store, console.Config{Token: "s3cret-token", Now: clk.now, SessionTTL: time.Hour})
	for i := range console.SignInFailures {
		if code, _ := f.post("/login", url.Values{"token": {"wrong"}}); code != http.StatusUnauthorized {
			t.Fatalf("failure %d: %d, want 401", i+1, code)
		}
		clk.add(time.Minute)
	}
	resp, err := f.client.PostForm(f.srv.URL+"/login", url.Values{"token": {"s3cret-token"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("after %d failures: %d, Retry-After %q; want 429 and a Retry-After", console.SignInFailures, resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if code, _, _ := f.get("/api/consumers"); code != http.StatusUnauthorized {
		t.Fatalf("signed in although refused: %d", code)
	}
	clk.add(console.SignInWindow - console.SignInFailures*time.Minute + time.Second) // the first failure leaves the window
	resp, err = f.client.PostForm(f.srv.URL+"/login", url.Values{"token": {"s3cret-token"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("after the window: %d, want 200", resp.StatusCode)
	}
	var session *http.Cookie
	for _, c := range resp.Request.Response.Cookies() {
		if c.Name == "idem_session" {
			session = c
		}
	}
	if session == nil || session.MaxAge != 3600 || !session.HttpOnly {
		t.Fatalf("session cookie %+v, want Max-Age 3600, HttpOnly", session)
	}
	if code, body, _ := f.get("/api/failed?consumer=payments"); code != 200 || !strings.Contains(body, "pay-1") {
		t.Fatalf("signed in: %d %s", code, body)
	}
	clk.add(time.Hour)
	if code, body, _ := f.get("/api/failed?consumer=payments"); code != http.StatusUnauthorized || strings.Contains(body, "pay-1") {
		t.Fatalf("expired session: %d %s, want 401", code, body)
	}
}

// failing is a store whose reads fail with err.
type failing struct {
	*idem.MemoryStore
	err error
}

func (f failing) ListRecords(context.Context, *idemdriver.ListRecordsParams) (idemdriver.RecordPage, error) {
	return idemdriver.RecordPage{}, f.err
}

// A store's error is named on the page by its code and message, without
// the detail that quotes a row's values, which --show-payloads shows.
func TestStoreErrorTextWithoutPayloads(t *testing.T) {
	pgErr := &pgconn.PgError{Code: "23505", Message: `duplicate key value violates unique constraint "x_pkey"`, Detail: "Key (id)=(card-4111-secret) already exists."}
	st := failing{idem.NewMemoryStore(nil), pgErr}
	f := newFixture(t, st, console.Config{})
	code, body, _ := f.get("/api/failed?consumer=payments")
	if code != 500 || !strings.Contains(body, "PostgreSQL error 23505") || strings.Contains(body, "card-4111") || strings.Contains(body, "duplicate key") {
		t.Errorf("hidden: %d %s", code, body)
	}
	if !strings.Contains(f.log.String(), "x_pkey") {
		t.Errorf("the log lacks the error: %s", f.log)
	}
	shown := newFixture(t, st, console.Config{ShowPayloads: true})
	if code, body, _ := shown.get("/failed?consumer=payments"); code != 500 || !strings.Contains(body, "card-4111") {
		t.Errorf("--show-payloads: %d %s", code, body)
	}
	missing := newFixture(t, failing{idem.NewMemoryStore(nil), &pgconn.PgError{Code: "42P01", Message: `relation "idem_typo" does not exist`}}, console.Config{})
	if code, body, _ := missing.get("/api/failed?consumer=payments"); code != 500 || !strings.Contains(body, "--table") {
		t.Errorf("missing table: %d %s", code, body)
	}
	if got := console.PublicError(errors.New("dial tcp: secret host"), false); strings.Contains(got, "secret") {
		t.Errorf("PublicError %q", got)
	}
}

// A consumer the table does not hold is named as unknown, with the
// consumers it does hold; a known consumer with no failures is an empty
// page.
func TestUnknownConsumer(t *testing.T) {
	store := idem.NewMemoryStore(nil)
	poisoned(t, store, "payments", "pay-1")
	f := newFixture(t, store, console.Config{})
	code, body, _ := f.get("/api/failed?consumer=paymnets")
	if code != http.StatusNotFound || !strings.Contains(body, `unknown consumer \"paymnets\"`) || !strings.Contains(body, `\"payments\"`) {
		t.Errorf("unknown consumer: %d %s", code, body)
	}
	if code, body, _ := f.get("/api/failed?consumer=payments&state=in_progress"); code != 200 || !strings.Contains(body, `"records": []`) {
		t.Errorf("known consumer, nothing in progress: %d %s", code, body)
	}
}

// A wrong --table is one clear error at start (Probe), not a failure on
// every page.
func TestProbeWrongTable(t *testing.T) {
	_, db, table := pgStore(t)
	wrong, err := idemsql.New(db, idemsql.Postgres, &idemsql.Config{Table: table + "_typo"})
	if err != nil {
		t.Fatal(err)
	}
	err = console.Probe(t.Context(), wrong)
	if !errors.Is(err, console.ErrTable) || !strings.Contains(err.Error(), "--table") {
		t.Errorf("wrong table: %v", err)
	}
	right, _ := idemsql.New(db, idemsql.Postgres, &idemsql.Config{Table: table})
	if err := console.Probe(t.Context(), right); err != nil {
		t.Errorf("right table: %v", err)
	}
}

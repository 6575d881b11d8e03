package browsertest

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver
	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/cmd/idem/internal/deadletter"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/idemsql"
)

// ScreenshotsEnv names a directory where the test saves a PNG of each
// main page (docs/console.md shows them); unset, it saves none.
const ScreenshotsEnv = "IDEM_CONSOLE_SCREENSHOTS"

// chromium returns the path of Debian's chromium, skipping the test when
// it is missing (failing under IDEM_TEST_REQUIRE_ALL=1).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if testenv.Required() {
		t.Fatal("chromium is not installed (required: IDEM_TEST_REQUIRE_ALL=1); ./scripts/services installs it (apt-get install chromium)")
	}
	t.Skip("chromium is not installed; ./scripts/services installs it (apt-get install chromium)")
	return ""
}

// world is a console over a PostgreSQL store holding failed work.
type world struct {
	t        *testing.T
	db       *sql.DB
	table    string
	store    *idemsql.Store
	consumer *idem.LeaseConsumer
	url      string
	runs     int
	audit    *bytes.Buffer // the console's audit log
	// The dead letters on Redis Streams: src is the stream consumed,
	// dead its dead-letter stream.
	rdb       *redis.Client
	redisURL  string
	dls       console.DeadLetters
	src, dead string
}

func newWorld(t *testing.T) *world {
	t.Helper()
	u := testenv.URL(t, testenv.PostgresEnv, "postgres://idem:idem@127.0.0.1:5432/idem_test?sslmode=disable")
	db, err := sql.Open("pgx", u)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	w := &world{t: t, db: db, table: "idem_browser_" + hex.EncodeToString(b)}
	t.Cleanup(w.drop)
	if w.store, err = idemsql.New(db, idemsql.Postgres, &idemsql.Config{Table: w.table}); err != nil {
		t.Fatal(err)
	}
	if err := w.store.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	if w.consumer, err = idem.NewLeaseConsumer(w.store, idem.Config{Name: "payments", MaxAttempts: 2, PurgeInterval: -1}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.consumer.Close() })
	w.audit = &bytes.Buffer{}
	w.redisURL = testenv.URL(t, "IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
	ropts, err := redis.ParseURL(w.redisURL)
	if err != nil {
		t.Fatal(err)
	}
	w.rdb = redis.NewClient(ropts)
	w.src, w.dead = "browser:"+hex.EncodeToString(b)+":orders", "browser:"+hex.EncodeToString(b)+":orders-dead"
	t.Cleanup(func() { w.rdb.Del(context.Background(), w.src, w.dead); _ = w.rdb.Close() })
	w.dls = deadletter.NewRedisStreams(w.rdb, "Redis Streams (browser test)")
	srv, err := console.New(console.Config{Store: w.store, Where: "postgres (browser test)", Logger: slog.New(slog.NewJSONHandler(w.audit, nil)),
		DeadLetters: w.dls, DeadLetterDests: []string{w.dead + "=orders"}})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	w.url = hs.URL
	return w
}

func (w *world) drop() {
	ctx := context.Background()
	for _, suffix := range []string{"", "_steps", "_runs", "_migrations", "_outbox"} {
		_, _ = w.db.ExecContext(ctx, "DROP TABLE IF EXISTS "+w.table+suffix)
	}
	_, _ = w.db.ExecContext(ctx, "DROP FUNCTION IF EXISTS "+w.table+"_outbox_notify()")
	_, _ = w.db.ExecContext(ctx, "DROP DOMAIN IF EXISTS "+w.table+"_outbox_id, "+w.table+"_outbox_str")
	_ = w.db.Close()
}

// deliver processes id twice with a handler that fails (the second
// delivery, the last of MaxAttempts 2, poisons it), or once with one that
// succeeds.
func (w *world) deliver(id string, ok bool) idem.Outcome {
	w.t.Helper()
	var out idem.Outcome
	for range map[bool]int{true: 1, false: 2}[ok] {
		out, _ = w.consumer.Process(w.t.Context(), idem.Message{ID: id, Payload: []byte(`{"amount":42}`)}, func(context.Context, *idem.Attempt) (idem.Result, error) {
			if ok {
				w.runs++
				return idem.Result{Body: []byte("charged")}, nil
			}
			return idem.Result{}, errors.New("card processor timed out")
		})
	}
	return out
}

// row returns the record's state, token and attempt, as stored.
func (w *world) row(id string) (state, token, attempt int64) {
	w.t.Helper()
	err := w.db.QueryRowContext(w.t.Context(), "SELECT state, token, attempt FROM "+w.table+" WHERE consumer_key = (SELECT key FROM "+w.table+"_consumers WHERE name = 'payments') AND message_id = $1", id).
		Scan(&state, &token, &attempt)
	if err != nil {
		w.t.Fatal(err)
	}
	return state, token, attempt
}

// TestConsoleInChromium loads the console's pages in headless Chromium
// over PostgreSQL holding failed work made by a LeaseConsumer and a Relay,
// clicks retry (a record's and an outbox row's) and confirms twice, and
// checks in the rows that each acted once.
func TestConsoleInChromium(t *testing.T) {
	exe := chromium(t)
	w := newWorld(t)
	for _, id := range []string{"pay-1", "pay-2", "pay-3"} {
		if out := w.deliver(id, false); !out.Poison {
			t.Fatalf("%s: %+v, want poison", id, out)
		}
	}
	w.failOutbox()
	_, token0, _ := w.row("pay-2")

	b := startBrowser(t, exe)

	b.do("consumers page", chromedp.Navigate(w.url+"/consumers"), chromedp.WaitVisible(chromedp.CSS("#consumers")))
	w.shot(b, "consumers")
	if got := b.text("#consumers"); !strings.Contains(got, "payments") {
		t.Fatalf("consumers page: %q", got)
	}
	b.do("failed page", chromedp.Click(chromedp.CSS(`a[href="/failed?consumer=payments"]`)), chromedp.WaitVisible(chromedp.CSS("#records")))
	w.shot(b, "failed")
	if got := b.text("#records"); strings.Count(got, "card processor timed out") != 3 {
		t.Fatalf("failed page: %q", got)
	}
	b.do("confirm page", chromedp.Click(chromedp.CSS(`a.act[href*="id=pay-2"]`)), chromedp.WaitVisible(chromedp.CSS("#confirm")))
	w.shot(b, "confirm")
	if _, token, _ := w.row("pay-2"); token != token0 {
		t.Fatalf("the confirm page changed the record (token %d, was %d)", token, token0)
	}
	// A double click on the confirm button: the form is submitted twice.
	b.do("retry", chromedp.DoubleClick(chromedp.CSS("#confirm")), chromedp.WaitVisible(chromedp.CSS("#result")))
	w.shot(b, "done")
	if got := b.text("#result"); !strings.Contains(got, "retryable") {
		t.Errorf("result: %q", got)
	}
	// Chromium submits a double-clicked form once (the console's own
	// tests post one confirmation twice: it acts once). A second
	// confirmation of the same retry changes nothing.
	b.do("the retry confirmed again", chromedp.Navigate(w.url+"/confirm?action=retry&consumer=payments&id=pay-2"),
		chromedp.WaitVisible(chromedp.CSS("#confirm")), chromedp.Click(chromedp.CSS("#confirm")), chromedp.WaitVisible(chromedp.CSS("#result")))
	if got := b.text("#result"); !strings.Contains(got, "nothing changed") {
		t.Errorf("second confirmation: %q, want nothing changed", got)
	}
	audit := w.audit.String()
	if strings.Count(audit, `"result":"changed"`) != 1 || strings.Count(audit, `"result":"unchanged"`) != 1 {
		t.Errorf("audit log: want one change, then one that changed nothing:\n%s", audit)
	}
	st, token, attempt := w.row("pay-2")
	if st != 1 || token != token0+1 || attempt != 0 {
		t.Errorf("pay-2 after a double click: state %d, token %d, attempt %d; want 1 (in progress), %d (one retry), 0", st, token, attempt, token0+1)
	}
	if out := w.deliver("pay-2", true); out.Status != idem.Processed || w.runs != 1 {
		t.Errorf("delivery after the retry: %+v, handler runs %d; want processed once", out, w.runs)
	}
	w.deliver("pay-2", true)
	if st, _, _ := w.row("pay-2"); st != 2 || w.runs != 1 {
		t.Errorf("pay-2: state %d, handler runs %d; want completed, run once", st, w.runs)
	}
	if st, _, _ := w.row("pay-1"); st != 3 {
		t.Errorf("pay-1: state %d, want still failed", st)
	}
	b.do("message page", chromedp.Navigate(w.url+"/message?consumer=payments&id=pay-2"), chromedp.WaitVisible(chromedp.CSS("#state")))
	w.shot(b, "message")
	if got := b.text("#state"); got != "completed" {
		t.Errorf("message page state %q, want completed", got)
	}

	b.do("outbox page", chromedp.Navigate(w.url+"/outbox"), chromedp.WaitVisible(chromedp.CSS("#groups")))
	w.shot(b, "outbox")
	if got := b.text("main"); !strings.Contains(got, "no route to receipts") || strings.Contains(got, "secret-card") {
		t.Errorf("outbox page (payloads must be hidden): %q", got)
	}
	b.do("outbox retry, double click",
		chromedp.Click(chromedp.CSS(`a.act[href*="outbox_id=out-1"]`)), chromedp.WaitVisible(chromedp.CSS("#confirm")),
		chromedp.DoubleClick(chromedp.CSS("#confirm")), chromedp.WaitVisible(chromedp.CSS("#result")))
	outResult := b.text("#result")
	var pending, failedRows int
	if err := w.db.QueryRowContext(t.Context(), "SELECT count(*) FILTER (WHERE failed_at IS NULL AND sent_at IS NULL), count(*) FILTER (WHERE failed_at IS NOT NULL) FROM "+w.table+"_outbox").
		Scan(&pending, &failedRows); err != nil {
		t.Fatal(err)
	}
	if pending != 1 || failedRows != 1 || !strings.Contains(outResult, "pending again") {
		t.Errorf("outbox after a double click: %d pending, %d failed, %q; want 1 and 1", pending, failedRows, outResult)
	}
}

// failOutbox emits two outbox rows and fails them for good with a relay
// whose publisher has no route.
func (w *world) failOutbox() {
	w.t.Helper()
	ctx := w.t.Context()
	tx, err := w.store.Begin(ctx)
	if err != nil {
		w.t.Fatal(err)
	}
	var rows []idemdriver.OutgoingRecord
	for _, id := range []string{"out-1", "out-2"} {
		rows = append(rows, idemdriver.OutgoingRecord{ID: id, Consumer: "payments", SourceID: "pay-1", Destination: "receipts", Payload: []byte("secret-card")})
	}
	if err := w.store.EmitTx(ctx, tx, &idemdriver.EmitParams{Consumer: "payments", Messages: rows}); err != nil {
		w.t.Fatal(err)
	}
	if err := w.store.Commit(ctx, tx); err != nil {
		w.t.Fatal(err)
	}
	relay, err := idem.NewRelay(idem.RelayConfig{Store: w.store, Publisher: idem.PublisherFunc(func(_ context.Context, msgs []idem.Outgoing) []error {
		errs := make([]error, len(msgs))
		for i := range errs {
			errs[i] = idem.Permanent(errors.New("no route to receipts"))
		}
		return errs
	})})
	if err != nil {
		w.t.Fatal(err)
	}
	if _, err := relay.RunOnce(ctx); err != nil {
		w.t.Fatal(err)
	}
}

// startBrowser starts headless Chromium at exe, stopped at the test's end;
// its steps have 2 minutes.
func startBrowser(t *testing.T, exe string) *browser {
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.WindowSize(1280, 800))
	actx, cancel := chromedp.NewExecAllocator(t.Context(), opts...)
	t.Cleanup(cancel)
	bctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	if err := chromedp.Do(bctx); err != nil { // starts the browser, without a timeout
		t.Fatalf("starting chromium: %v", err)
	}
	ctx, cancel := context.WithTimeout(bctx, 2*time.Minute)
	t.Cleanup(cancel)
	return &browser{t: t, ctx: ctx}
}

// browser runs steps in one tab.
type browser struct {
	t   *testing.T
	ctx context.Context
}

func (b *browser) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	if err := chromedp.Do(b.ctx, steps...); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
}

// text is the text of the first element that matches the CSS selector.
func (b *browser) text(css string) string {
	b.t.Helper()
	s, err := chromedp.Run(b.ctx, chromedp.Text(chromedp.CSS(css)))
	if err != nil {
		b.t.Fatalf("text of %s: %v", css, err)
	}
	return s
}

// shot saves a screenshot of the page as console-name.png under
// ScreenshotsEnv.
func (w *world) shot(b *browser, name string) {
	dir := os.Getenv(ScreenshotsEnv)
	if dir == "" {
		return
	}
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		w.t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "console-"+name+".png"), png, 0o644); err != nil {
		w.t.Fatal(err)
	}
}

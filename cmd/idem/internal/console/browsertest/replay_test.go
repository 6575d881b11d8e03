package browsertest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemredisstream"
	"github.com/idem-go/idem/cmd/idem/idemcli"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/testenv"
)

// orders runs the consumer "orders" (lease mode, MaxAttempts 1) behind
// idemredisstream on w.src, dead-lettering to w.dead; its handler fails
// until healed, then counts its runs per message.
type orders struct {
	mu     sync.Mutex
	healed bool
	runs   map[string]int
}

func (o *orders) handle(_ context.Context, a *idem.Attempt) (idem.Result, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.healed {
		return idem.Result{}, errors.New("warehouse offline")
	}
	o.runs[a.Message.ID]++
	return idem.Result{Body: []byte("shipped")}, nil
}

func (o *orders) count(id string) int { o.mu.Lock(); defer o.mu.Unlock(); return o.runs[id] }
func (o *orders) heal()               { o.mu.Lock(); o.healed = true; o.mu.Unlock() }

func (w *world) runOrders() *orders {
	w.t.Helper()
	o := &orders{runs: map[string]int{}}
	lc, err := idem.NewLeaseConsumer(w.store, idem.Config{Name: "orders", MaxAttempts: 1, PurgeInterval: -1})
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { _ = lc.Close() })
	c, err := idemredisstream.NewConsumer(w.rdb, idemredisstream.Config{Processor: idem.BindLease(lc, o.handle), Stream: w.src,
		Group: "idem", Consumer: "browser", DeadLetter: w.dead, Block: 50 * time.Millisecond})
	if err != nil {
		w.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	w.t.Cleanup(func() { cancel(); <-done })
	prod := idemredisstream.NewProducer(w.rdb, idemredisstream.ProducerConfig{})
	for _, id := range []string{"o-1", "o-2", "o-3"} {
		if _, err := prod.Publish(w.t.Context(), w.src, []byte(`{"sku":"secret-sku"}`), idemredisstream.WithMessageID(id)); err != nil {
			w.t.Fatal(err)
		}
	}
	testenv.Eventually(w.t, 20*time.Second, "three dead letters", func() bool { return w.rdb.XLen(w.t.Context(), w.dead).Val() == 3 }, nil)
	return o
}

// inSource is how many entries the consumed stream holds: the originals
// and every replay.
func (w *world) inSource() int64 { return w.rdb.XLen(w.t.Context(), w.src).Val() }

// records counts the consumer's records by state (1 in progress, 2
// completed, 3 failed).
func (w *world) records(consumer string) map[int64]int {
	w.t.Helper()
	rows, err := w.db.QueryContext(w.t.Context(), "SELECT state, count(*) FROM "+w.table+" WHERE consumer_key = (SELECT key FROM "+w.table+"_consumers WHERE name = $1) GROUP BY state", consumer)
	if err != nil {
		w.t.Fatal(err)
	}
	defer rows.Close()
	n := map[int64]int{}
	for rows.Next() {
		var st int64
		var c int
		if err := rows.Scan(&st, &c); err != nil {
			w.t.Fatal(err)
		}
		n[st] = c
	}
	return n
}

// backdate makes the consumer's records two hours old and its running
// time three hours long, by the database's clock, so that a purge of
// what is outrun by an hour of running time deletes them all.
func (w *world) backdate(consumer string) {
	w.t.Helper()
	ctx := w.t.Context()
	if err := w.store.MarkRunning(ctx, &idemdriver.MarkRunningParams{Consumer: consumer}); err != nil {
		w.t.Fatal(err)
	}
	for _, q := range []string{
		"UPDATE " + w.table + " SET processed_at = processed_at - interval '2 hours' WHERE consumer_key = (SELECT key FROM " + w.table + "_consumers WHERE name = $1)",
		"UPDATE " + w.table + "_runs SET started_at = started_at - interval '3 hours' WHERE consumer = $1",
	} {
		if _, err := w.db.ExecContext(ctx, q, consumer); err != nil {
			w.t.Fatal(err)
		}
	}
}

// cli runs the idem command and returns its exit status and output.
func (w *world) cli(args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := idemcli.Main(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestReplayAndPurgeInChromium: dead letters written by a real consumer
// behind Redis Streams are listed in Chromium, grouped by cause; a replay
// clicked and confirmed with a double click republishes one copy, which
// is processed once; a second replay is refused; the same through
// `idem replay`. Then purge now, clicked and confirmed, deletes the
// records once, and `idem purge` does the same for another consumer.
func TestReplayAndPurgeInChromium(t *testing.T) {
	exe := chromium(t)
	w := newWorld(t)
	pgURL := testenv.URL(t, testenv.PostgresEnv, "postgres://idem:idem@127.0.0.1:5432/idem_test?sslmode=disable")
	o := w.runOrders()
	b := startBrowser(t, exe)

	b.do("dead letters index", chromedp.Navigate(w.url+"/deadletters"), chromedp.WaitVisible(chromedp.CSS("#destinations")),
		chromedp.Click(chromedp.CSS("#destinations a")), chromedp.WaitVisible(chromedp.CSS("#dead-letters")))
	w.shot(b, "deadletters")
	if got := b.text("#dl-groups"); !strings.Contains(got, "3") || !strings.Contains(got, "poison") || !strings.Contains(got, "warehouse offline") {
		t.Errorf("causes: %q", got)
	}
	if got := b.text("#dead-letters"); strings.Index(got, "o-3") > strings.Index(got, "o-1") || strings.Contains(got, "secret-sku") {
		t.Errorf("dead letters (newest first, payloads hidden): %q", got)
	}
	before := w.inSource()
	o.heal()
	b.do("replay o-2", chromedp.Click(chromedp.CSS(`#dead-letters tr:nth-child(2) a.act`)), chromedp.WaitVisible(chromedp.CSS("#confirm")))
	w.shot(b, "replay-confirm")
	if w.inSource() != before {
		t.Fatal("the confirm page published")
	}
	b.do("confirm the replay, double click", chromedp.DoubleClick(chromedp.CSS("#confirm")), chromedp.WaitVisible(chromedp.CSS("#result")))
	if got := b.text("#result"); !strings.Contains(got, `replayed dead letter`) || !strings.Contains(got, `"o-2"`) {
		t.Fatalf("replay result: %q", got)
	}
	testenv.Eventually(t, 20*time.Second, "o-2 processed", func() bool { return o.count("o-2") == 1 && w.records("orders")[2] == 1 }, nil)
	if n := w.inSource() - before; n != 1 {
		t.Errorf("%d copies of o-2 published, want 1", n)
	}
	b.do("replay o-2 again", chromedp.Navigate(w.url+"/deadletters?dest="+w.dead+"&consumer=orders"), chromedp.WaitVisible(chromedp.CSS("#dead-letters")),
		chromedp.Click(chromedp.CSS(`#dead-letters tr:nth-child(2) a.act`)), chromedp.WaitVisible(chromedp.CSS("#confirm")),
		chromedp.Click(chromedp.CSS("#confirm")), chromedp.WaitVisible(chromedp.CSS("#error")))
	if got := b.text("#error"); !strings.Contains(got, "completed") {
		t.Errorf("second replay: %q, want refused as completed", got)
	}
	if n := w.inSource() - before; n != 1 || o.count("o-2") != 1 {
		t.Errorf("after a refused replay: %d copies, o-2 ran %d times; want 1 and 1", n, o.count("o-2"))
	}

	// The same through the idem command: o-3, the newest dead letter.
	code, stdout, stderr := w.cli("failed", "--store", pgURL, "--table", w.table, "--broker", w.redisURL, "--dead-letter", w.dead, "--consumer", "orders", "--limit", "1", "--json")
	var list console.DeadLettersView
	if code != 0 || json.Unmarshal([]byte(stdout), &list) != nil || len(list.Groups) != 1 || list.Groups[0].Count != 3 ||
		len(list.Letters) != 1 || list.Letters[0].MessageID != "o-3" || list.Next == "" || strings.Contains(stdout, "secret-sku") {
		t.Fatalf("idem failed --dead-letter: %d %s %s", code, stdout, stderr)
	}
	dl := list.Letters
	replay := []string{"replay", "--store", pgURL, "--table", w.table, "--broker", w.redisURL, "--dead-letter", w.dead,
		"--consumer", "orders", "--position", dl[0].Position, "--json"}
	code, stdout, stderr = w.cli(replay...)
	var v console.ActionView
	if code != 0 || json.Unmarshal([]byte(stdout), &v) != nil || !v.Changed || v.MessageID != "o-3" {
		t.Fatalf("idem replay: %d %s %s", code, stdout, stderr)
	}
	testenv.Eventually(t, 20*time.Second, "o-3 processed", func() bool { return o.count("o-3") == 1 && w.records("orders")[2] == 2 }, nil)
	if code, _, stderr := w.cli(replay...); code != 1 || !strings.Contains(stderr, "completed") {
		t.Errorf("second idem replay: %d %s, want refused as completed", code, stderr)
	}
	if n := w.inSource() - before; n != 2 || o.count("o-3") != 1 || o.count("o-1") != 0 {
		t.Errorf("after the CLI: %d copies, o-3 ran %d times, o-1 %d; want 2, 1, 0", n, o.count("o-3"), o.count("o-1"))
	}
	if strings.Contains(stdout+stderr, "secret-sku") {
		t.Errorf("the command printed a payload: %s %s", stdout, stderr)
	}

	// Purge now: orders has o-1 failed, o-2 and o-3 completed.
	w.backdate("orders")
	b.do("purge confirm", chromedp.Navigate(w.url+"/consumers"), chromedp.WaitVisible(chromedp.CSS("#consumers")),
		chromedp.SetValue(chromedp.CSS(`form:has(input[value="orders"]) input[name="older_than"]`), "1h"),
		chromedp.Click(chromedp.CSS(`form:has(input[value="orders"]) button`)), chromedp.WaitVisible(chromedp.CSS("#confirm")))
	w.shot(b, "purge-confirm")
	if n := w.records("orders"); n[2]+n[3] != 3 {
		t.Fatalf("the confirm page purged: %v", n)
	}
	b.do("purge, double click", chromedp.DoubleClick(chromedp.CSS("#confirm")), chromedp.WaitVisible(chromedp.CSS("#result")))
	if got := b.text("main"); !strings.Contains(got, "3 records deleted") {
		t.Errorf("purge result: %q", got)
	}
	if n := w.records("orders"); len(n) != 0 {
		t.Errorf("orders after the purge: %v, want none", n)
	}
	audit := w.audit.String()
	if strings.Count(audit, `"action":"purge","what"`) != 1 || strings.Count(audit, `"action":"replay","what"`) != 2 {
		t.Errorf("audit log: want one purge and two replays (one refused):\n%s", audit)
	}

	// idem purge, on payments.
	for _, id := range []string{"pay-1", "pay-2"} {
		w.deliver(id, true)
	}
	w.backdate("payments")
	purge := []string{"purge", "--store", pgURL, "--table", w.table, "--consumer", "payments", "--older-than", "1h"}
	if code, stdout, stderr := w.cli(purge...); code != 0 || !strings.Contains(stdout, "deleted 2 records") {
		t.Errorf("idem purge: %d %s %s", code, stdout, stderr)
	}
	if code, stdout, _ := w.cli(purge...); code != 0 || !strings.Contains(stdout, "deleted 0 records") {
		t.Errorf("second idem purge: %d %s", code, stdout)
	}
	if n := w.records("payments"); len(n) != 0 {
		t.Errorf("payments after idem purge: %v, want none", n)
	}
}

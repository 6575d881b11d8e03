package riverexample

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
)

// The worker process is this test binary run again with childEnv set: it
// runs TestWorkerProcess only, which reads its setup from these variables.
const (
	childEnv    = "RIVEREXAMPLE_CHILD" // "ledger" or "charge": the job kind it works
	urlEnv      = "RIVEREXAMPLE_URL"
	schemaEnv   = "RIVEREXAMPLE_SCHEMA"
	providerEnv = "RIVEREXAMPLE_PROVIDER"
	pauseEnv    = "RIVEREXAMPLE_PAUSE_AT" // a payment ID: stop there, print pausedLine, wait for the kill
)

const pausedLine = "PAUSED "

// payments is how many payments each test enqueues; each one twice, as two
// jobs (a producer that retried its insert).
const payments = 20

// pausedPayment is the payment whose first attempt is killed.
const pausedPayment = "p07"

// TestWorkerKilledMidJob enqueues 20 payments, each as two jobs, starts a
// worker process, SIGKILLs it in the middle of one payment's job (ledger:
// after the row is written, before the commit; charge: after the provider
// charged, before idem recorded the answer), then starts a second worker
// process, which River's rescuer hands the stuck job to. Every job
// completes, and each payment has exactly one ledger row, or exactly one
// charge at the provider although the provider was asked twice for the
// killed one.
func TestWorkerKilledMidJob(t *testing.T) {
	t.Parallel()
	url := testenv.URL(t, testenv.PostgresEnv, "postgres://user:pass@127.0.0.1:5432/postgres")
	for _, kind := range []string{"ledger", "charge"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			b := setup(t, url, kind)

			first := b.start(t, pausedPayment)
			first.waitPaused(t)
			first.kill(t)

			second := b.start(t, "")
			testenv.Eventually(t, 3*time.Minute, "every job completed", func() bool {
				return b.completed(t) == 2*payments
			}, func() string { return b.states(t) + "\nworker log:\n" + second.log() })
			second.stop(t)

			// River ran the killed payment's job again: a second attempt.
			var attempts int
			if err := b.pool.QueryRow(context.Background(),
				`SELECT max(attempt) FROM river_job WHERE args->>'payment_id' = $1`, pausedPayment).Scan(&attempts); err != nil {
				t.Fatal(err)
			}
			if attempts < 2 {
				t.Errorf("the killed payment's jobs ran %d attempt(s), want a retry", attempts)
			}
			switch kind {
			case "ledger":
				b.checkLedger(t)
			case "charge":
				b.checkCharges(t)
			}
		})
	}
}

type bundle struct {
	url, schema, kind string
	pool              *pgxpool.Pool
	provider          *fakeProvider
	providerURL       string
}

func setup(t *testing.T, url, kind string) *bundle {
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(context.Background()) })
	b := &bundle{url: url, kind: kind, schema: fmt.Sprintf("riverexample_%s_%d", kind, time.Now().UnixNano())}
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+b.schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP SCHEMA "+b.schema+" CASCADE") })
	b.pool = openPool(t, url, b.schema)

	store, err := idempgxv5.New(b.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := Migrate(ctx, b.pool, store); err != nil {
		t.Fatal(err)
	}
	if kind == "charge" {
		b.provider = &fakeProvider{charges: map[string]string{}, requests: map[string]int{}}
		srv := httptest.NewServer(b.provider)
		t.Cleanup(srv.Close)
		b.providerURL = srv.URL
	}

	// An insert-only client enqueues the jobs, each payment twice.
	inserter, err := river.NewClient(riverpgxv5.New(b.pool), &river.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var jobs []river.InsertManyParams
	for range 2 {
		for i := range payments {
			p := PaymentArgs{PaymentID: fmt.Sprintf("p%02d", i), AmountCents: int64(100 + i)}
			var args river.JobArgs = LedgerArgs{p}
			if kind == "charge" {
				args = ChargeArgs{p}
			}
			jobs = append(jobs, river.InsertManyParams{Args: args})
		}
	}
	if _, err := inserter.InsertMany(ctx, jobs); err != nil {
		t.Fatal(err)
	}
	return b
}

func openPool(tb testing.TB, url, schema string) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		tb.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

func (b *bundle) completed(t *testing.T) int {
	var n int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM river_job WHERE state = 'completed'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (b *bundle) states(t *testing.T) string {
	rows, err := b.pool.Query(context.Background(), `SELECT state::text, count(*) FROM river_job GROUP BY 1 ORDER BY 1`)
	if err != nil {
		return err.Error()
	}
	var parts []string
	for rows.Next() {
		var state string
		var n int
		if err := rows.Scan(&state, &n); err != nil {
			return err.Error()
		}
		parts = append(parts, fmt.Sprintf("%s=%d", state, n))
	}
	return "jobs: " + strings.Join(parts, " ")
}

func (b *bundle) checkLedger(t *testing.T) {
	ctx := context.Background()
	var rows, distinct, records int
	if err := b.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT payment_id) FROM ledger`).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM idem_processed WHERE consumer_key = (SELECT key FROM idem_processed_consumers WHERE name = 'ledger')`).Scan(&records); err != nil {
		t.Fatal(err)
	}
	t.Logf("ledger: %d jobs for %d payments, one killed mid-job: %d ledger rows, %d distinct payments, %d idem records",
		2*payments, payments, rows, distinct, records)
	if rows != payments || distinct != payments || records != payments {
		t.Errorf("ledger rows %d, distinct payments %d, idem records %d; want %d each", rows, distinct, records, payments)
	}
}

func (b *bundle) checkCharges(t *testing.T) {
	charges, requests, paused := b.provider.counts(pausedPayment)
	t.Logf("charge: %d jobs for %d payments, one killed after the provider's answer: %d charges at the provider, %d requests (%d for %s)",
		2*payments, payments, charges, requests, paused, pausedPayment)
	if charges != payments {
		t.Errorf("%d charges at the provider, want %d", charges, payments)
	}
	if paused < 2 {
		t.Errorf("the provider was asked %d time(s) for %s, want the killed attempt's request and the retry's", paused, pausedPayment)
	}
	for id, n := range b.provider.perPayment() {
		if n != 1 {
			t.Errorf("payment %s charged %d times", id, n)
		}
	}
	var completed int
	if err := b.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM idem_processed WHERE consumer_key = (SELECT key FROM idem_processed_consumers WHERE name = 'charges') AND state = 2` /* 2: completed */).Scan(&completed); err != nil {
		t.Fatal(err)
	}
	if completed != payments {
		t.Errorf("%d idem records for the charges, want %d", completed, payments)
	}
}

// fakeProvider is a payment provider with idempotency keys: a request with
// a key it has seen answers the first request's charge.
type fakeProvider struct {
	mu       sync.Mutex
	charges  map[string]string // idempotency key -> payment ID
	requests map[string]int    // payment ID -> requests
}

func (p *fakeProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var args PaymentArgs
	key := r.Header.Get("Idempotency-Key")
	if err := json.NewDecoder(r.Body).Decode(&args); err != nil || key == "" {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	p.requests[args.PaymentID]++
	if _, ok := p.charges[key]; !ok {
		p.charges[key] = args.PaymentID
	}
	p.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]string{"id": "ch_" + key[:12]})
}

func (p *fakeProvider) counts(payment string) (charges, requests, forPayment int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, n := range p.requests {
		requests += n
	}
	return len(p.charges), requests, p.requests[payment]
}

func (p *fakeProvider) perPayment() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int{}
	for _, id := range p.charges {
		out[id]++
	}
	return out
}

// worker is a running worker process.
type worker struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	paused chan string
	mu     sync.Mutex
	stderr bytes.Buffer
}

func (w *worker) log() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stderr.String()
}

type lockedWriter struct{ w *worker }

func (l lockedWriter) Write(p []byte) (int, error) {
	l.w.mu.Lock()
	defer l.w.mu.Unlock()
	return l.w.stderr.Write(p)
}

func (b *bundle) start(t *testing.T, pauseAt string) *worker {
	cmd := exec.Command(os.Args[0], "-test.run=^TestWorkerProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(),
		childEnv+"="+b.kind, urlEnv+"="+b.url, schemaEnv+"="+b.schema,
		providerEnv+"="+b.providerURL, pauseEnv+"="+pauseAt)
	w := &worker{cmd: cmd, paused: make(chan string, 1)}
	cmd.Stderr = lockedWriter{w}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if w.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if id, ok := strings.CutPrefix(sc.Text(), pausedLine); ok {
				w.paused <- id
			} else {
				_, _ = lockedWriter{w}.Write([]byte(sc.Text() + "\n"))
			}
		}
		close(w.paused)
	}()
	return w
}

func (w *worker) waitPaused(t *testing.T) {
	select {
	case id, ok := <-w.paused:
		if !ok || id != pausedPayment {
			t.Fatalf("the worker ended before pausing at %s (got %q):\n%s", pausedPayment, id, w.log())
		}
	case <-time.After(3 * time.Minute):
		t.Fatalf("the worker did not reach %s in 3 minutes:\n%s", pausedPayment, w.log())
	}
}

func (w *worker) kill(t *testing.T) {
	if err := w.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := w.cmd.Wait()
	if ws, ok := w.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the worker was not killed by SIGKILL: %v", err)
	}
}

// stop closes the worker's standard input, on which it stops River and
// exits.
func (w *worker) stop(t *testing.T) {
	_ = w.stdin.Close()
	if err := w.cmd.Wait(); err != nil {
		t.Fatalf("the worker did not stop cleanly: %v\n%s", err, w.log())
	}
}

// TestWorkerProcess is the worker process of TestWorkerKilledMidJob; run
// directly (without childEnv) it does nothing.
func TestWorkerProcess(t *testing.T) {
	kind := os.Getenv(childEnv)
	if kind == "" {
		return
	}
	ctx := context.Background()
	pool := openPool(t, os.Getenv(urlEnv), os.Getenv(schemaEnv))
	store, err := idempgxv5.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	pauseAt := os.Getenv(pauseEnv)
	var once sync.Once
	pause := func(paymentID string) {
		if paymentID != pauseAt {
			return
		}
		once.Do(func() { fmt.Printf("%s%s\n", pausedLine, paymentID) })
		select {} // until SIGKILL
	}
	ledger, err := idem.NewConsumer[pgx.Tx](store, idem.Config{Name: "ledger"})
	if err != nil {
		t.Fatal(err)
	}
	defer ledger.Close()
	charges, err := idem.NewLeaseConsumer(store, idem.Config{Name: "charges", Lease: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer charges.Close()
	lw := &LedgerWorker{Pool: pool, Consumer: ledger, pause: pause}
	transport := &http.Transport{}
	defer transport.CloseIdleConnections()
	provider := HTTPProvider{URL: os.Getenv(providerEnv), Client: &http.Client{Transport: transport}}
	cw := &ChargeWorker{Consumer: charges, Provider: provider, pause: pause}

	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}},
		Workers:           NewWorkers(lw, cw),
		FetchCooldown:     20 * time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
		// A job left running by a killed process is retried after this
		// (production: longer than any job runs; River's default is an hour).
		JobTimeout:           10 * time.Second,
		RescueStuckJobsAfter: 11 * time.Second,
		RetryPolicy:          retryNow{},
		Logger:               slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, os.Stdin) // until the test closes it
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := client.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
}

// retryNow retries a failed job at once (the test's jobs fail only when a
// process dies under them).
type retryNow struct{}

func (retryNow) NextRetry(*rivertype.JobRow) time.Time { return time.Now() }

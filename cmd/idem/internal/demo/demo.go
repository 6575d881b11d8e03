//go:build !nodemo

// Package demo is `idem demo`: the Idempotent Consumer pattern run end to
// end on real parts. A producer publishes payments with their business key
// as the message ID (and some twice), consumers run by idem's broker
// adapters charge each one through idem (a ledger row in the claim's
// transaction, a fake payment provider called with a derived key), die on
// purpose mid-message, and come back; an outbox relays PaymentCharged
// events to a receipts consumer. The report counts what happened and says
// whether every payment was charged and receipted exactly once.
//
// By default everything runs in process (an embedded NATS JetStream server
// and SQLite); flags name external brokers and stores. The idem command
// declares the flags with [Options.AddFlags] and calls [Run].
package demo

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"golang.org/x/term"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/connect"
	"github.com/idem-go/idem/cmd/idem/internal/operate"
	"github.com/idem-go/idem/cmd/idem/internal/promserve"
	"github.com/idem-go/idem/cmd/idem/internal/secret"
	"github.com/spf13/pflag"
)

// demoConsumer is the consumer name of the demo's payments service.
const demoConsumer = "idem-demo-payments"

// Options are the demo's settings, one per flag of `idem demo`
// ([Options.AddFlags] declares them with their defaults).
type Options struct {
	// Messages is how many payments to publish and charge (at least 1).
	Messages int
	// Duplicates is the fraction of messages published twice (0..1).
	Duplicates float64
	// CrashRate is the chance per message that a consumer dies (0 <= r < 1).
	CrashRate float64
	// Consumers is how many consumers run at once (1..256).
	Consumers int
	// Dir is the folder of the databases and the stream, kept after the
	// run; "" is a temporary folder, removed.
	Dir string
	// Store is the processed-messages store URL ("sqlite:" is a file in Dir).
	Store string
	// Broker is the broker URL (nats:embedded, kafka:embedded, ...).
	Broker string
	// AckWait is how long the broker waits for an ack before redelivering
	// (at least 100ms).
	AckWait time.Duration
	// Timeout ends the run, reporting lost messages (at least 1s).
	Timeout time.Duration
	// Seed seeds the payments, the duplicates and the crashes.
	Seed uint64
	// JSON prints the report as one JSON object.
	JSON bool
	// Progress is auto, bar, lines or none.
	Progress string
	// WithoutIdem runs the same story through a naive consumer.
	WithoutIdem bool
	// MetricsAddr, when set, serves Prometheus /metrics there during the run.
	MetricsAddr string
	// Console keeps a console up on the demo's store after the report, on
	// ConsoleAddr (loopback only), until ctx ends; the demo first stages
	// failed work to look at, under a consumer of its own.
	Console bool
	// ConsoleAddr is where the console listens (host:port; port 0 picks
	// one). Without Console it must be empty or the default: the flag
	// alone is refused rather than ignored.
	ConsoleAddr string
	// consoleUp, set by tests, is called with the console's URL once it
	// listens and its work is staged.
	consoleUp func(url string)
	// afterRun, set by tests, is called with the /metrics URL once the run
	// is over and reported, before the metrics server stops.
	afterRun func(metricsURL string)
}

// UsageError is a bad setting (the idem command exits 2 on it).
type UsageError struct{ Err error }

// Error is the wrapped error's text.
func (e UsageError) Error() string { return e.Err.Error() }

// Unwrap returns the wrapped error.
func (e UsageError) Unwrap() error { return e.Err }

// ErrNotExactlyOnce means the demo ran to its end but found a payment
// charged or receipted twice, or not at all (the idem command exits 3).
var ErrNotExactlyOnce = errors.New("not every payment was charged and receipted exactly once")

// report is what `idem demo` prints; the JSON keys are a stable interface.
type report struct {
	Messages               int   `json:"messages"`
	Deliveries             int64 `json:"deliveries"`
	DuplicatesPublished    int64 `json:"duplicates_published"`
	PublishRetries         int64 `json:"publish_retries"`
	BrokerDroppedDups      int64 `json:"duplicates_dropped_by_broker"`
	DuplicatesAbsorbed     int64 `json:"duplicates_absorbed"`
	InProgressRedeliveries int64 `json:"in_progress_redeliveries"`
	ConsumerCrashes        int64 `json:"consumer_crashes"`
	LedgerCharges          int64 `json:"ledger_charges"`
	ProviderCharges        int64 `json:"provider_charges"`
	ProviderReplays        int64 `json:"provider_replays"`
	DoubleCharges          int64 `json:"double_charges"`
	Lost                   int64 `json:"lost"`
	DeadLettered           int64 `json:"dead_lettered"`
	// The receipts story (demo_receipts.go): events through the outbox,
	// receipts sent by the downstream consumer.
	EventsEmitted  int64   `json:"events_emitted"`
	RelayCrashes   int64   `json:"relay_crashes"`
	ReceiptCrashes int64   `json:"receipt_consumer_crashes"`
	ReceiptsSent   int64   `json:"receipts_sent"`
	ReceiptReplays int64   `json:"receipt_replays"`
	DoubleReceipts int64   `json:"double_receipts"`
	LostReceipts   int64   `json:"lost_receipts"`
	ElapsedS       float64 `json:"elapsed_s"`
	MessagesPerS   float64 `json:"messages_per_s"`
	Store          string  `json:"store"`
	Broker         string  `json:"broker"`
	// OK is true when every payment was charged exactly once.
	OK bool `json:"ok"`
	// Verdict is the report's last line, in words.
	Verdict  string       `json:"verdict"`
	Settings demoSettings `json:"settings"`
	// WithoutIdem is set by --without-idem: where the naive consumer's
	// lost payments come from.
	NaiveConsumer *naiveReport `json:"naive_consumer,omitempty"`
}

// AddFlags declares the flags of `idem demo` on f, each setting a field
// of o, with their defaults.
func (o *Options) AddFlags(f *pflag.FlagSet) {
	f.IntVar(&o.Messages, "messages", 10000, "payments to publish and charge")
	f.Float64Var(&o.Duplicates, "duplicates", 0.1, "fraction of messages the producer publishes twice (0..1)")
	f.Float64Var(&o.CrashRate, "crash-rate", 0.002, "chance per message that a consumer dies: half after the provider call and before the commit, half after the commit and before the ack (at least 0, below 1)")
	f.IntVar(&o.Consumers, "consumers", 4, "concurrent consumers")
	f.StringVar(&o.Dir, "dir", "", "folder for the databases and the stream, kept after the run (default: a temporary folder, removed)")
	f.StringVar(&o.Store, "store", "sqlite:", "processed-messages store: sqlite:[PATH], postgres://..., mysql://..., or redis://HOST:PORT/DB (lease mode)")
	f.StringVar(&o.Broker, "broker", "nats:embedded", "broker: nats:embedded, nats://HOST:PORT, kafka:embedded (franz-go kfake, 3 brokers), kafka://HOST:PORT, amqp://USER:PASS@HOST:PORT/ (RabbitMQ) or redis://HOST:PORT/DB (Redis Streams)")
	f.DurationVar(&o.AckWait, "ack-wait", time.Second, "how long the broker waits for an ack before redelivering")
	f.DurationVar(&o.Timeout, "timeout", 5*time.Minute, "give up (and report lost messages) after this long")
	f.Uint64Var(&o.Seed, "seed", 1, "seed for the payments, the duplicates and the crashes")
	f.BoolVar(&o.JSON, "json", false, "print the report as one JSON object (with the settings, ok and the verdict)")
	f.BoolVar(&o.WithoutIdem, "without-idem", false, "run the same story (same seed, same faults) through a naive consumer without idem, to see the double charges and lost payments idem prevents; exits 0 when it ran")
	f.StringVar(&o.Progress, "progress", "auto", "progress display: auto (a bar on a terminal), bar, lines or none")
	f.BoolVar(&o.Console, "console", false, "after the report, stage some failed work (failed records, a held lease, failed outbox rows, under the consumer "+refundsConsumer+") and keep the web console up on the demo's store until interrupted (not with a redis:// store)")
	f.StringVar(&o.ConsoleAddr, "console-addr", operate.DefaultConsoleAddr, "with --console: where the console listens, on loopback only (port 0 picks a free one)")
	f.StringVar(&o.MetricsAddr, "metrics-addr", "", "serve Prometheus metrics of the consumers (idem_messages_total, idem_claims_active, ...) on http://ADDR/metrics while the demo runs, e.g. 127.0.0.1:9464 (default: off)")
}

func (o *Options) validate() error {
	switch {
	case o.Messages < 1:
		return UsageError{fmt.Errorf("--messages must be at least 1, got %d", o.Messages)}
	case o.Duplicates < 0 || o.Duplicates > 1:
		return UsageError{fmt.Errorf("--duplicates must be in 0..1, got %v", o.Duplicates)}
	case o.CrashRate < 0 || o.CrashRate >= 1:
		return UsageError{fmt.Errorf("--crash-rate must be at least 0 and below 1, got %v", o.CrashRate)}
	case o.Consumers < 1 || o.Consumers > 256:
		return UsageError{fmt.Errorf("--consumers must be in 1..256, got %d", o.Consumers)}
	case o.Timeout < time.Second:
		return UsageError{fmt.Errorf("--timeout must be at least 1s, got %v", o.Timeout)}
	case o.AckWait < 100*time.Millisecond:
		return UsageError{fmt.Errorf("--ack-wait must be at least 100ms, got %v", o.AckWait)}
	}
	switch o.Progress {
	case "auto", "bar", "lines", "none":
	default:
		return UsageError{fmt.Errorf("--progress must be auto, bar, lines or none, got %q", o.Progress)}
	}
	if !o.Console && o.ConsoleAddr != "" && o.ConsoleAddr != operate.DefaultConsoleAddr {
		return UsageError{fmt.Errorf("--console-addr %s is for the console: add --console", o.ConsoleAddr)}
	}
	if o.Console && strings.HasPrefix(o.Store, "redis:") {
		return UsageError{errors.New("--console shows a SQL store (sqlite:, postgres://, mysql://), not redis://")}
	}
	return nil
}

// payment is the PaymentRequested message body.
type payment struct {
	PaymentID   string `json:"payment_id"`
	Customer    string `json:"customer"`
	AmountCents int64  `json:"amount_cents"`
}

func paymentFor(seed uint64, i int) payment {
	r := rand.New(rand.NewPCG(seed, uint64(i)))
	return payment{
		PaymentID:   fmt.Sprintf("pay-%07d", i),
		Customer:    fmt.Sprintf("cus-%04d", r.IntN(5000)),
		AmountCents: 100 + r.Int64N(99900),
	}
}

// chance is a deterministic draw in [0,1) for (seed, what, i), so a run
// resumed on the same folder makes the same choices.
func chance(seed uint64, what string, i int) float64 {
	h := fnv.New64a()
	h.Write([]byte(what))
	return rand.New(rand.NewPCG(seed^h.Sum64(), uint64(i))).Float64()
}

// crashDraws decides where the demo's consumers and relay crash, by draws
// keyed by the seed, the place and the message ID (chance), so that runs
// with one seed crash the same messages at the same places whatever order
// the consumers take them in. Each visit of a message to a place draws
// anew: a message that crashed there gets another chance on redelivery.
type crashDraws struct {
	seed   uint64
	mu     sync.Mutex
	visits map[string]int // by place and message ID
}

func newCrashDraws(seed uint64) *crashDraws {
	return &crashDraws{seed: seed, visits: map[string]int{}}
}

// draw is the draw in [0,1) of this visit of message id to place.
func (d *crashDraws) draw(place, id string) float64 {
	k := place + "/" + id
	d.mu.Lock()
	n := d.visits[k]
	d.visits[k] = n + 1
	d.mu.Unlock()
	return chance(d.seed, k, n)
}

// crash reports whether this visit of message id to place crashes, with
// probability rate.
func (d *crashDraws) crash(place, id string, rate float64) bool {
	return rate > 0 && d.draw(place, id) < rate
}

// demoBroker is what the demo needs of a broker: the adapter's producer
// and consumers, and what the demo counts on the broker itself.
type demoBroker interface {
	// publish publishes payload through the adapter's producer, with the
	// payment's business key as the message ID, and reports whether the
	// broker dropped it as a duplicate (JetStream's window).
	publish(ctx context.Context, id string, payload []byte) (dropped bool, err error)
	// member returns one consumer (a consumer-group member) running p
	// through the adapter, on a connection or client of its own.
	member(ctx context.Context, p idem.Processor, log *slog.Logger) (*member, error)
	// unfinished counts messages not yet delivered and acknowledged.
	unfinished(ctx context.Context) (int, error)
	// deadLettered counts the messages in the dead letter.
	deadLettered(ctx context.Context) (int64, error)
	close()
	eventsBroker
}

// demoRetryDelay is the adapters' delay before a Failed delivery comes back.
const demoRetryDelay = 100 * time.Millisecond

// member is one running consumer: an adapter's Run, and the closing of its
// connection or client.
type member struct {
	run      func(context.Context) error
	shutdown func()
	once     sync.Once
	dead     atomic.Bool // crashed: processes nothing more
	// background: a crash closes in the background (Kafka: closing the
	// client revokes partitions, and the revocation waits for the handler
	// that is crashing).
	background bool
}

func (m *member) close() { m.once.Do(m.shutdown) }

// crash kills the member from inside one of its handlers, as a killed
// process: its connection is gone before the adapter could ack anything
// more, and what it had not acked comes back to another member.
func (m *member) crash() {
	m.dead.Store(true)
	if m.background {
		go m.close()
	} else {
		m.close()
	}
}

type demoRun struct {
	o        *Options
	st       *connect.SQLStore
	prov     *provider
	broker   demoBroker
	consumer *idem.Consumer[*sql.Tx]
	// lease is the lease-mode consumer used with --store redis://; then
	// consumer is nil and the ledger is written outside any transaction.
	lease      *redisLease
	leaseWhere string
	log        *slog.Logger // the adapters' errors
	draws      *crashDraws  // where the crashes happen

	deliveries, dupAbsorbed, inProgress, crashes atomic.Int64
	dupPublished, brokerDropped, published       atomic.Int64
	publishRetries                               atomic.Int64 // publishes made again after a failure
	naiveAttempts                                atomic.Int64 // --without-idem: provider keys used
	naiveAcked, naiveDropped, naivePending       atomic.Int64 // --without-idem: acked on receipt, dropped by a crash after the ack, queued
	receiptsStory
}

// Run runs the demo with o, printing the report to stdout and progress and
// errors to stderr. It returns a [UsageError] for a bad setting, an error
// wrapping [ErrNotExactlyOnce] when the run found a double or lost charge
// or receipt (never with WithoutIdem: a demonstration), and ctx's error
// when ctx ends first (then without a report). With Console it serves the
// console after the report until ctx ends, then returns as without it.
func Run(ctx context.Context, o *Options, stdout, stderr io.Writer) (err error) {
	if err := o.validate(); err != nil {
		return err
	}
	var consoleLn net.Listener
	if o.Console {
		if consoleLn, err = listenConsole(o.ConsoleAddr); err != nil {
			return err
		}
		defer consoleLn.Close()
	}
	var metrics *promserve.Server
	if o.MetricsAddr != "" {
		if metrics, err = promserve.Serve(o.MetricsAddr); err != nil {
			return err
		}
		defer metrics.Close()
		fmt.Fprintf(stderr, "idem demo: metrics on %s\n", metrics.URL())
	}
	dir := o.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "idem-demo-"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	progressPath := filepath.Join(dir, "producer.next")
	next, fresh := readProgress(progressPath)

	storeURL := o.Store
	if storeURL == "sqlite:" || storeURL == "sqlite" {
		storeURL = "sqlite:" + filepath.Join(dir, "consumer.db")
	}
	r := &demoRun{o: o, draws: newCrashDraws(o.Seed), log: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelError}))}
	if strings.HasPrefix(storeURL, "redis:") {
		// Lease mode: the processed-message records live in Redis, and the
		// ledger in the payments service's own SQLite file beside them.
		if r.lease, r.leaseWhere, err = openRedisLease(ctx, storeURL, fresh, metrics.Hooks()); err != nil {
			return err
		}
		defer r.lease.Close()
		storeURL = "sqlite:" + filepath.Join(dir, "ledger.db")
	}
	if r.st, err = connect.OpenSQL(ctx, storeURL, demoTable); err != nil {
		return err
	}
	defer r.st.DB.Close()
	if err := r.st.Store.Migrate(ctx); err != nil {
		return fmt.Errorf("migrate %s: %w", r.st.Where, err)
	}
	if err := r.prepareLedger(ctx, fresh); err != nil {
		return err
	}
	if r.prov, err = openProvider(ctx, filepath.Join(dir, "provider.db")); err != nil {
		return err
	}
	defer r.prov.close()
	if fresh && o.Dir == "" {
		// A new temporary folder has an empty provider; nothing to reset.
	} else if fresh {
		if err := r.prov.reset(ctx); err != nil {
			return err
		}
	}
	switch {
	case strings.HasPrefix(o.Broker, "nats:"):
		r.broker, err = openNATS(ctx, o.Broker, dir, o.AckWait, fresh)
	case strings.HasPrefix(o.Broker, "kafka:"):
		if o.Broker == "kafka:embedded" && !fresh {
			return UsageError{errors.New("--broker kafka:embedded keeps its log in memory, so a run cannot resume on --dir; use a new --dir, or nats:embedded")}
		}
		r.broker, err = openKafka(ctx, o.Broker)
	case strings.HasPrefix(o.Broker, "amqp:") || strings.HasPrefix(o.Broker, "amqps:"):
		r.broker, err = openAMQP(ctx, o.Broker, fresh)
	case strings.HasPrefix(o.Broker, "redis:"):
		r.broker, err = openRedisStreams(ctx, o.Broker, o.AckWait, fresh)
	default:
		return UsageError{fmt.Errorf("--broker %q: want nats:embedded, nats://HOST:PORT, kafka:embedded, kafka://HOST:PORT, amqp://USER:PASS@HOST:PORT/ or redis://HOST:PORT/DB", o.Broker)}
	}
	if err != nil {
		return err
	}
	defer r.broker.close()
	if o.WithoutIdem && r.lease != nil {
		return UsageError{errors.New("--without-idem runs on a SQL store (sqlite:, postgres://, mysql://), not redis://")}
	}
	if err := r.openReceipts(ctx, dir, fresh, metrics.Hooks()); err != nil {
		return err
	}
	defer r.closeReceipts()
	if r.lease == nil {
		r.consumer, err = idem.NewConsumer(r.st.Store, idem.Config{Name: demoConsumer, PurgeInterval: -1, Hooks: metrics.Hooks(), Relay: r.wakeRelay()})
		if err != nil {
			return err
		}
		defer r.consumer.Close()
	}

	start := time.Now()
	charged0, _, _ := r.ledgerCounts(ctx)
	runCtx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	var wg sync.WaitGroup
	prodErr := make(chan error, 1)
	wg.Add(1)
	go func() { defer wg.Done(); prodErr <- r.produce(runCtx, next, progressPath) }()
	workCtx, stopWork := context.WithCancel(runCtx)
	for i := 0; i < o.Consumers; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); r.consumeForever(workCtx) }()
	}
	r.runReceipts(workCtx, &wg)
	waitErr := r.waitDone(runCtx, prodErr, stderr)
	stopWork()
	wg.Wait()
	if waitErr != nil && ctx.Err() != nil {
		return waitErr // interrupted: no report
	}

	rep, err := r.report(context.WithoutCancel(ctx), time.Since(start), charged0)
	if err == nil {
		err = r.reportReceipts(context.WithoutCancel(ctx), &rep)
	}
	if err != nil {
		return err
	}
	rep = r.tell(rep)
	if err := printReport(stdout, rep, o.JSON); err != nil {
		return err
	}
	if o.afterRun != nil && metrics != nil {
		o.afterRun(metrics.URL())
	}
	if consoleLn != nil {
		if err := r.serveConsole(ctx, consoleLn, stderr); err != nil {
			return err
		}
	}
	if o.WithoutIdem {
		return waitErr // a demonstration: it ran, whatever it shows
	}
	if !rep.OK {
		return fmt.Errorf("%w (double charges %d, lost %d, double receipts %d, lost receipts %d)", ErrNotExactlyOnce,
			rep.DoubleCharges, rep.Lost, rep.DoubleReceipts, rep.LostReceipts)
	}
	if waitErr != nil {
		return waitErr
	}
	return nil
}

// prepareLedger creates the ledger, the consumer's own side-effect table,
// and empties it (with the processed records) for a fresh run on a kept store.
func (r *demoRun) prepareLedger(ctx context.Context, fresh bool) error {
	ddl := `CREATE TABLE IF NOT EXISTS idem_demo_ledger (
		payment_id   VARCHAR(64) NOT NULL,
		customer     VARCHAR(64) NOT NULL,
		amount_cents BIGINT NOT NULL,
		charge_id    BIGINT NOT NULL
	)`
	if r.lease != nil {
		// In lease mode the ledger row is an external side effect: it gets
		// an idempotency key of its own (Attempt.Key), as any third party's
		// write would.
		ddl = `CREATE TABLE IF NOT EXISTS idem_demo_ledger (
		payment_id   VARCHAR(64) NOT NULL,
		customer     VARCHAR(64) NOT NULL,
		amount_cents BIGINT NOT NULL,
		charge_id    BIGINT NOT NULL,
		entry_key    VARCHAR(100) NOT NULL UNIQUE
	)`
	}
	if _, err := r.st.DB.ExecContext(ctx, ddl); err != nil {
		return fmt.Errorf("create the ledger on %s: %w", r.st.Where, err)
	}
	if !fresh {
		return nil
	}
	// No unique key on payment_id, on purpose: a double charge must show
	// up as a second row, not be hidden by a constraint.
	for _, d := range []struct {
		q    string
		args []any
	}{
		{`DELETE FROM idem_demo_ledger`, nil},
		{connect.Rebind(r.st.Dialect, `DELETE FROM `+demoTable+` WHERE `+consumerIs(r.st.Dialect)), []any{demoConsumer}},
	} {
		if _, err := r.st.DB.ExecContext(ctx, d.q, d.args...); err != nil {
			return fmt.Errorf("reset the demo tables on %s: %w", r.st.Where, err)
		}
	}
	return nil
}

// produce publishes payments next..messages-1, recording progress so a run
// on the same folder resumes, and republishes the chosen duplicates a
// little later (after the broker's dedupe window), as a producer retry does.
func (r *demoRun) produce(ctx context.Context, next int, progressPath string) error {
	type retry struct {
		id  string
		at  time.Time
		msg []byte
	}
	var retries []retry
	flush := func(force bool) error {
		for len(retries) > 0 && (force || time.Now().After(retries[0].at)) {
			if force {
				if d := time.Until(retries[0].at); d > 0 {
					time.Sleep(d)
				}
			}
			dropped, err := r.publish(ctx, retries[0].id, retries[0].msg)
			if err != nil {
				return err
			}
			r.dupPublished.Add(1)
			if dropped {
				r.brokerDropped.Add(1)
			}
			retries = retries[1:]
		}
		return nil
	}
	for i := next; i < r.o.Messages; i++ {
		p := paymentFor(r.o.Seed, i)
		body, _ := json.Marshal(p)
		if _, err := r.publish(ctx, p.PaymentID, body); err != nil {
			return fmt.Errorf("publish %s: %w", p.PaymentID, err)
		}
		r.published.Add(1)
		if chance(r.o.Seed, "dup", i) < r.o.Duplicates {
			retries = append(retries, retry{p.PaymentID, time.Now().Add(150 * time.Millisecond), body})
		}
		if err := flush(false); err != nil {
			return err
		}
		if i%100 == 99 || i == r.o.Messages-1 {
			if err := writeProgress(progressPath, i+1); err != nil {
				return err
			}
		}
	}
	if err := writeProgress(progressPath, r.o.Messages); err != nil {
		return err
	}
	return flush(true)
}

// publishAttemptTimeout bounds one publish and its confirm: a confirm lost
// with a broker restart is not waited for until the end of the run.
const publishAttemptTimeout = 10 * time.Second

// publish publishes one message through the broker, again with the same
// message ID after a failure (the broker restarting, a lost confirm), with
// exponential backoff, until it is confirmed or ctx ends: a publish whose
// confirm was lost may have been stored, and the consumers deduplicate the
// copy. It returns ctx's error, wrapping the last failure, or an invalid
// message ID's at once.
func (r *demoRun) publish(ctx context.Context, id string, payload []byte) (dropped bool, err error) {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 50 * time.Millisecond
	bo.MaxInterval = 2 * time.Second
	return backoff.Retry(ctx, func() (bool, error) {
		actx, cancel := context.WithTimeout(ctx, publishAttemptTimeout)
		defer cancel()
		dropped, err := r.broker.publish(actx, id, payload)
		switch {
		case err == nil:
			return dropped, nil
		case errors.Is(err, idem.ErrInvalidMessageID) || errors.Is(err, idem.ErrMissingMessageID):
			return false, backoff.Permanent(err)
		}
		r.publishRetries.Add(1)
		r.log.Warn("publish failed; publishing again with the same message ID", "message_id", id, "err", err)
		return false, err
	}, backoff.WithBackOff(bo), backoff.WithMaxElapsedTime(0))
}

// consumeForever runs one payments consumer; when it crashes a new one
// takes over.
func (r *demoRun) consumeForever(ctx context.Context) {
	r.consumeLane(ctx, r.broker.member, r.process, &r.crashes, r.o.WithoutIdem)
}

// consumeLane runs one consumer, joined with join and processing with
// process, counting its crashes; when it crashes a new one takes over.
// With naivePayments (the payments lane of --without-idem) a naive worker
// acknowledges on receipt and charges afterwards instead.
func (r *demoRun) consumeLane(ctx context.Context, join func(context.Context, idem.Processor, *slog.Logger) (*member, error),
	process func(context.Context, idem.Message) (idem.Outcome, error), crashes *atomic.Int64, naivePayments bool) {
	for ctx.Err() == nil {
		mctx, cancel := context.WithCancel(ctx)
		var m *member
		var naive *naiveWorker
		if naivePayments {
			naive = r.startNaive(mctx, func() { cancel(); m.crash() })
		}
		p := idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
			if m.dead.Load() { // the adapter hands over what it had buffered
				return idem.Outcome{Status: idem.Failed, MessageID: msg.ID, Err: errCrash}, errCrash
			}
			if naive != nil {
				return naive.Process(ctx, msg)
			}
			out, err := process(ctx, msg)
			if errors.Is(err, errCrash) {
				crashes.Add(1)
				m.crash()
				cancel()
			}
			return out, err
		})
		m, err := join(ctx, p, r.log)
		if err == nil {
			err = m.run(mctx) // until a crash or the end of the run
			m.close()
		}
		if naive != nil {
			naive.stop() // charges what it acked, unless it crashed
		}
		cancel()
		if err != nil { // a crash, or the broker failing: start again shortly
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// errCrash marks the two ways the demo kills a consumer.
var errCrash = errors.New("consumer died")

// errCrashBeforeCommit is how the demo kills a consumer between the
// provider's charge and the commit of the ledger row.
var errCrashBeforeCommit = fmt.Errorf("%w after the provider call, before its commit", errCrash)

// errCrashAfterCommit is how the demo kills a consumer between the commit
// and the ack: the adapter never sees the Processed outcome.
var errCrashAfterCommit = fmt.Errorf("%w after its commit, before the ack", errCrash)

// process runs one delivery through the consumer of the store's mode and
// counts what happened. Half of the --crash-rate crashes come here, after
// a commit.
func (r *demoRun) process(ctx context.Context, m idem.Message) (out idem.Outcome, err error) {
	r.deliveries.Add(1)
	if r.lease != nil {
		out, err = r.lease.Process(ctx, m, r.chargeLeased)
	} else {
		out, err = r.consumer.Process(ctx, m, r.charge)
	}
	switch {
	case out.Status == idem.Processed && r.draws.crash("payments-after-commit", m.ID, r.o.CrashRate/2):
		return idem.Outcome{Status: idem.Failed, MessageID: m.ID, Err: errCrashAfterCommit}, errCrashAfterCommit
	case out.Status == idem.Duplicate:
		r.dupAbsorbed.Add(1)
	case out.Status == idem.InProgress:
		r.inProgress.Add(1)
	}
	return out, err
}

// chargeLeased is the payments handler in lease mode (Redis): the charge is
// a recovery point (Attempt.Step), so an attempt that takes over after a
// crash does not call the provider again, and the provider call carries
// the derived key in case the crash came between the call and the step's
// save; the ledger row is written with a key of its own.
func (r *demoRun) chargeLeased(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
	var p payment
	if err := json.Unmarshal(a.Message.Payload, &p); err != nil {
		return idem.Result{}, idem.Permanent(fmt.Errorf("payment %s: %w", a.Message.ID, err))
	}
	chargeID, err := a.Step(ctx, "charge", func(ctx context.Context) ([]byte, error) {
		id, err := r.prov.charge(ctx, a.Key("charge"), p.PaymentID, p.AmountCents)
		return []byte(strconv.FormatInt(id, 10)), err
	})
	if err != nil {
		return idem.Result{}, err
	}
	if r.draws.crash("payments-before-commit", a.Message.ID, r.o.CrashRate/2) {
		return idem.Result{}, errCrashBeforeCommit
	}
	id, err := strconv.ParseInt(string(chargeID), 10, 64)
	if err != nil {
		return idem.Result{}, idem.Permanent(fmt.Errorf("payment %s: charge ID %q: %w", a.Message.ID, chargeID, err))
	}
	err = r.emitChargedLeased(ctx, a.Message, p, id, a.Key("ledger"))
	return idem.Result{Body: chargeID, ContentType: "text/plain"}, err
}

// charge is the payments handler: it calls the provider with a key derived
// from the message ID (the call survives a crash; the redelivery sends the
// same key), then writes the ledger row in the claim's transaction.
//
// Half of the --crash-rate crashes happen here, after the provider charged
// and before the commit: the redelivery calls the provider again with the
// same key and gets the first charge back (a provider replay), so the
// customer is charged once.
func (r *demoRun) charge(ctx context.Context, tx *sql.Tx, m idem.Message) error {
	var p payment
	if err := json.Unmarshal(m.Payload, &p); err != nil {
		return fmt.Errorf("payment %s: %w", m.ID, err)
	}
	chargeID, err := r.prov.charge(ctx, idem.DeriveKey(demoConsumer, m.ID, "charge"), p.PaymentID, p.AmountCents)
	if err != nil {
		return err
	}
	if r.draws.crash("payments-before-commit", m.ID, r.o.CrashRate/2) {
		return errCrashBeforeCommit
	}
	_, err = tx.ExecContext(ctx, connect.Rebind(r.st.Dialect,
		`INSERT INTO idem_demo_ledger (payment_id, customer, amount_cents, charge_id) VALUES (?, ?, ?, ?)`),
		p.PaymentID, p.Customer, p.AmountCents, chargeID)
	if err != nil {
		return err
	}
	// The PaymentCharged event commits with the ledger row, or not at all.
	_, err = idem.Emit(ctx, r.chargedEvent(p, chargeID))
	return err
}

// waitDone waits until the producer is done, every payment is in the ledger
// and the broker has nothing unacked, showing progress meanwhile.
func (r *demoRun) waitDone(ctx context.Context, prodErr <-chan error, stderr io.Writer) error {
	show := newProgress(r.o.Progress, stderr, r.o.Messages)
	defer show.finish()
	produced := false
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("demo stopped before every payment was charged: %w", ctx.Err())
		case err := <-prodErr:
			if err != nil {
				return err
			}
			produced = true
		case <-tick.C:
		}
		_, distinct, err := r.ledgerCounts(ctx)
		if err != nil {
			continue
		}
		show.update(int(distinct))
		if !produced || distinct < int64(r.o.Messages) && !r.o.WithoutIdem {
			continue
		}
		// Without idem, payments lost after their ack never reach the
		// ledger: done when the broker and the workers have nothing left.
		// (Read after unfinished: whatever the broker counts as done was
		// queued before its ack.)
		if n, err := r.broker.unfinished(ctx); err == nil && n == 0 && r.naivePending.Load() == 0 && r.receiptsDone(ctx) {
			return nil
		}
	}
}

func (r *demoRun) ledgerCounts(ctx context.Context) (rows, distinct int64, err error) {
	err = r.st.DB.QueryRowContext(ctx,
		`SELECT count(*), count(DISTINCT payment_id) FROM idem_demo_ledger`).Scan(&rows, &distinct)
	return rows, distinct, err
}

func (r *demoRun) report(ctx context.Context, elapsed time.Duration, charged0 int64) (report, error) {
	rows, distinct, err := r.ledgerCounts(ctx)
	if err != nil {
		return report{}, err
	}
	provCharges, provDoubles, err := r.prov.totals(ctx)
	if err != nil {
		return report{}, err
	}
	rep := report{
		Messages:               r.o.Messages,
		Deliveries:             r.deliveries.Load(),
		DuplicatesPublished:    r.dupPublished.Load(),
		PublishRetries:         r.publishRetries.Load(),
		BrokerDroppedDups:      r.brokerDropped.Load(),
		DuplicatesAbsorbed:     r.dupAbsorbed.Load(),
		InProgressRedeliveries: r.inProgress.Load(),
		ConsumerCrashes:        r.crashes.Load(),
		LedgerCharges:          rows,
		ProviderCharges:        provCharges,
		ProviderReplays:        r.prov.replays.Load(),
		DoubleCharges:          (rows - distinct) + provDoubles,
		Lost:                   int64(r.o.Messages) - distinct,
		ElapsedS:               elapsed.Seconds(),
		Store:                  cmp.Or(r.leaseWhere, r.st.Where),
		Broker:                 secret.URL(r.o.Broker),
	}
	if r.o.WithoutIdem {
		rep.NaiveConsumer = &naiveReport{AckedBeforeCharge: r.naiveAcked.Load(), DroppedAfterAck: r.naiveDropped.Load()}
	}
	if rep.DeadLettered, err = r.broker.deadLettered(ctx); err != nil {
		return report{}, err
	}
	if s := elapsed.Seconds(); s > 0 {
		rep.MessagesPerS = float64(distinct-charged0) / s
	}
	return rep, nil
}

func readProgress(path string) (next int, fresh bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, true
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return 0, true
	}
	return n, false
}

// writeProgress records the next payment to publish, atomically.
func writeProgress(path string, next int) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.Itoa(next)+"\n"), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// progress shows how many payments are charged: a bar on a terminal, a
// line every two seconds otherwise.
type progress struct {
	w     io.Writer
	mode  string
	total int
	last  time.Time
	start time.Time
	shown bool
}

func newProgress(mode string, w io.Writer, total int) *progress {
	if mode == "auto" {
		mode = "lines"
		if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			mode = "bar"
		}
	}
	return &progress{w: w, mode: mode, total: total, start: time.Now()}
}

func (p *progress) update(done int) {
	switch p.mode {
	case "bar":
		const width = 40
		fill := width * done / p.total
		rate := float64(done) / time.Since(p.start).Seconds()
		fmt.Fprintf(p.w, "\r[%s%s] %d/%d charged  %.0f/s ", strings.Repeat("=", fill), strings.Repeat(" ", width-fill), done, p.total, rate)
		p.shown = true
	case "lines":
		if time.Since(p.last) >= 2*time.Second {
			fmt.Fprintf(p.w, "idem demo: %d/%d payments charged\n", done, p.total)
			p.last = time.Now()
		}
	}
}

func (p *progress) finish() {
	if p.shown {
		fmt.Fprintln(p.w)
	}
}

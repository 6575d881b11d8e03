package soaktest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"
	_ "modernc.org/sqlite"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemkafka"
	"github.com/idem-go/idem/broker/idemnats"
	"github.com/idem-go/idem/broker/idemredisstream"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/idem-go/idem/store/idemredis"
	"github.com/idem-go/idem/store/idemsql"
)

// The environment of a consumer process: its role and where its servers
// are.
const (
	roleEnv     = "IDEM_SOAK_ROLE"
	pgEnv       = "IDEM_SOAK_PG"
	natsEnv     = "IDEM_SOAK_NATS"
	sqliteEnv   = "IDEM_SOAK_SQLITE"
	controlEnv  = "IDEM_SOAK_CONTROL"
	kafkaEnv    = "IDEM_SOAK_KAFKA"
	redisEnv    = "IDEM_SOAK_REDIS"
	providerEnv = "IDEM_SOAK_PROVIDER"
	// brokenEnv makes a consumer broken on purpose, for the test that
	// the checker catches it: "ack-first" (sqlite-kafka only).
	brokenEnv = "IDEM_SOAK_BROKEN"
)

// exitSetup is a consumer process's exit code when it could not be set up
// (a server being killed or unreachable): the supervisor starts it again,
// and counts it as a crash only when it fails many times in a row.
const exitSetup = 3

// exitReconnect is a consumer process's exit code when it was set up and
// worked, then lost a broker connection its client does not dial again
// (the Go CDK's rabbitpubsub): the supervisor starts it again and does not
// count it toward a streak of failed set-ups.
const exitReconnect = 4

// The names the pipelines share between the test and the consumers.
const (
	natsStream    = "SOAK"
	natsIn        = "soak.in"
	natsOut       = "soak.out"
	natsDead      = "soak.dead"
	natsDurable   = "soak"
	kafkaIn       = "soak-in"
	kafkaDead     = "soak-dead"
	redisIn       = "soak-in"
	redisDead     = "soak-dead"
	orderKeys     = 8
	keyHeader     = "Soak-Key"
	pgConsumer    = "soak-pg"
	sqlConsumer   = "soak-sqlite"
	leaseConsumer = "soak-redis"
)

func TestMain(m *testing.M) {
	switch role := os.Getenv(roleEnv); role {
	case "":
	case "idem-consume":
		os.Exit(runSidecar())
	default:
		os.Exit(runRole(role))
	}
	os.Exit(m.Run())
}

// runRole runs a consumer process until it is killed (or SIGTERM).
func runRole(role string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	run := map[string]func(context.Context, *slog.Logger) error{
		"pg-nats": runPGNATS, "sqlite-kafka": runSQLiteKafka, "redis-lease": runRedisLease,
		"mariadb-amqp": runMariaDBAMQP, "pgsql-gocdk": runPGSQLGoCDK,
	}[role]
	if run == nil {
		fmt.Fprintf(os.Stderr, "soak: unknown role %q\n", role)
		return 1
	}
	err := run(ctx, log)
	if err == nil || ctx.Err() != nil {
		return 0
	}
	fmt.Fprintf(os.Stderr, "soak: %s: %v\n", role, err)
	var re runError
	if errors.As(err, &re) {
		return 1
	}
	if errors.Is(err, errBrokerClosed) {
		return exitReconnect
	}
	return exitSetup
}

// runError is the error that ended a consumer's Run. Any other error of a
// role comes from setting it up, when a server may be down or unreachable
// (a fault): the process is started again.
type runError struct{ err error }

func (e runError) Error() string { return "run: " + e.err.Error() }
func (e runError) Unwrap() error { return e.err }

// ran classifies the error Run returned: a group that could not be
// created at start (the server unreachable) is a setup error.
func ran(err error) error {
	if err == nil || strings.Contains(err.Error(), "create group") {
		return err
	}
	return runError{err}
}

// connectNATS connects to url, reconnecting for ever; a connection that
// answers no ping for 3s (a stalled one) is given up and made again.
func connectNATS(url string) (jetstream.JetStream, error) {
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		nats.RetryOnFailedConnect(true), nats.PingInterval(time.Second), nats.MaxPingsOutstanding(3))
	if err != nil {
		return nil, err
	}
	return jetstream.New(nc)
}

// runPGNATS consumes soak.in into PostgreSQL: the effect is counted in
// soak_effects, and each processing takes the next number of its
// ordering key (soak_keys, locked by the UPDATE until the commit) and
// emits it through the outbox to soak.out; the relay runs here too.
func runPGNATS(ctx context.Context, log *slog.Logger) error {
	pcfg, err := pgxpool.ParseConfig(os.Getenv(pgEnv))
	if err != nil {
		return err
	}
	pcfg.MaxConns = 8
	// A connection stalled mid-transaction holds its key's row lock: the
	// server ends such a session after this, as a production setting would.
	pcfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = "3000"
	// A stalled idle connection would hold its server session (and a slot
	// of max_connections) for good: the server ends sessions idle for
	// 20s, and the pool drops its own idle ones first.
	pcfg.ConnConfig.RuntimeParams["idle_session_timeout"] = "20000"
	pcfg.MaxConnIdleTime = 10 * time.Second
	pcfg.HealthCheckPeriod = 5 * time.Second
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := idempgxv5.New(pool, nil)
	if err != nil {
		return err
	}
	js, err := connectNATS(os.Getenv(natsEnv))
	if err != nil {
		return err
	}
	defer js.Conn().Close()
	relay, err := idem.NewRelay(idem.RelayConfig{Store: store, Publisher: idemnats.NewPublisher(js),
		Lease: 3 * time.Second, MinPoll: 20 * time.Millisecond, MaxPoll: 500 * time.Millisecond,
		MinRetry: 100 * time.Millisecond, MaxRetry: time.Second, Logger: log})
	if err != nil {
		return err
	}
	c, err := idem.NewConsumer(store, idem.Config{Name: pgConsumer, StoreTimeout: 2 * time.Second,
		PurgeInterval: -1, Relay: relay, Logger: log})
	if err != nil {
		return err
	}
	defer c.Close()
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	cons, err := js.Consumer(sctx, natsStream, natsDurable)
	cancel()
	if err != nil {
		return err
	}
	handler := func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
		if _, err := tx.Exec(ctx, `INSERT INTO soak_effects (id) VALUES ($1)
			ON CONFLICT (id) DO UPDATE SET n = soak_effects.n + 1`, m.ID); err != nil {
			return err
		}
		key := string(m.Payload)
		var n int64
		if err := tx.QueryRow(ctx, `UPDATE soak_keys SET n = n + 1 WHERE k = $1 RETURNING n`, key).Scan(&n); err != nil {
			return err
		}
		_, err := idem.Emit(ctx, idem.OutgoingMessage{Name: "seq", Destination: natsOut, Key: key,
			Payload: []byte(strconv.FormatInt(n, 10)), Headers: map[string]string{keyHeader: key}})
		return err
	}
	nc, err := idemnats.NewConsumer(js, cons, idemnats.Config{Processor: idem.Bind(c, handler),
		DeadLetter: natsDead, Concurrency: 4, MaxMessages: 16, RetryDelay: 200 * time.Millisecond,
		// A handler blocked on a stalled connection (pgx reads without a
		// deadline when the context has none) holds its message, kept
		// alive by in-progress reports, for HandlerTimeout: the default 5
		// minutes made two drains wait that long.
		HandlerTimeout: 20 * time.Second, Logger: log})
	if err != nil {
		return err
	}
	go relay.Run(ctx)
	return ran(nc.Run(ctx))
}

// sqliteCounting is the effect of the SQLite pipeline.
func sqliteCounting(ctx context.Context, tx *sql.Tx, m idem.Message) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO soak_effects (id) VALUES (?)
		ON CONFLICT (id) DO UPDATE SET n = n + 1`, m.ID)
	return err
}

// runSQLiteKafka consumes soak-in from Kafka into SQLite. It watches the
// control file: "full" caps the database at its current size (PRAGMA
// max_page_count on the one connection), so that writes needing a new
// page fail with SQLITE_FULL; anything else lifts the cap.
func runSQLiteKafka(ctx context.Context, log *slog.Logger) error {
	db, err := sql.Open("sqlite", idemsql.SQLiteDSN(os.Getenv(sqliteEnv)))
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(1) // the cap is per connection: one connection takes it
	db.SetConnMaxIdleTime(0)
	store, err := idemsql.New(db, idemsql.SQLite, nil)
	if err != nil {
		return err
	}
	c, err := idem.NewConsumer(store, idem.Config{Name: sqlConsumer, StoreTimeout: 2 * time.Second,
		PurgeInterval: -1, Logger: log})
	if err != nil {
		return err
	}
	defer c.Close()
	go watchDiskFull(ctx, db, os.Getenv(controlEnv))
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(strings.Split(os.Getenv(kafkaEnv), ",")...),
		kgo.ConsumerGroup("soak"), kgo.ConsumeTopics(kafkaIn),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.SessionTimeout(6 * time.Second), kgo.HeartbeatInterval(500 * time.Millisecond),
		kgo.FetchMaxWait(200 * time.Millisecond),
	}, idemkafka.ClientOpts()...)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	var proc idem.Processor = idem.Bind(c, sqliteCounting)
	if os.Getenv(brokenEnv) == "ack-first" {
		proc = ackFirst(proc)
	}
	kc, err := idemkafka.NewConsumer(cl, idemkafka.Config{Processor: proc,
		DeadLetter: kafkaDead, RetryDelay: 100 * time.Millisecond, Logger: log})
	if err != nil {
		return err
	}
	return ran(kc.Run(ctx))
}

// ackFirst is a broken Processor: it answers Processed at once, so that
// the adapter acknowledges the message, and runs p a second later in the
// background. A consumer killed in that second has acknowledged messages
// whose effect never ran: losses the soak's checker must report.
func ackFirst(p idem.Processor) idem.Processor {
	return idem.ProcessorFunc(func(ctx context.Context, m idem.Message) (idem.Outcome, error) {
		go func() {
			time.Sleep(time.Second)
			_, _ = p.Process(context.WithoutCancel(ctx), m)
		}()
		return idem.Outcome{Status: idem.Processed, MessageID: m.ID}, nil
	})
}

// watchDiskFull applies the control file's state to db's connection, and
// writes what it applied to control+".ack".
func watchDiskFull(ctx context.Context, db *sql.DB, control string) {
	applied := ""
	for ctx.Err() == nil {
		b, _ := os.ReadFile(control)
		want := strings.TrimSpace(string(b))
		if want != applied {
			var pages int64
			err := db.QueryRowContext(ctx, `PRAGMA page_count`).Scan(&pages)
			limit := int64(1<<30 - 1)
			if want == "full" {
				limit = pages
			}
			if err == nil {
				_, err = db.ExecContext(ctx, `PRAGMA max_page_count = `+strconv.FormatInt(limit, 10))
			}
			if err == nil {
				applied = want
				_ = os.WriteFile(control+".ack", []byte(want), 0o644)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// tokenKey carries, in a lease delivery's context, where the handler
// leaves its attempt's fencing token.
type tokenKey struct{}

// runRedisLease consumes soak-in from Redis Streams in lease mode: the
// effect is the provider's charge under the attempt's idempotency key
// (a recovery point keeps its answer), and every Processed outcome is
// reported to the provider with the completing attempt's token before the
// entry is acknowledged.
func runRedisLease(ctx context.Context, log *slog.Logger) error {
	opts, err := redis.ParseURL(os.Getenv(redisEnv))
	if err != nil {
		return err
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	store, err := idemredis.New(rdb, nil)
	if err != nil {
		return err
	}
	lc, err := idem.NewLeaseConsumer(store, idem.Config{Name: leaseConsumer, Lease: 3 * time.Second,
		StoreTimeout: time.Second, MaxAttempts: 1000, PurgeInterval: -1, Logger: log})
	if err != nil {
		return err
	}
	defer lc.Close()
	provider := os.Getenv(providerEnv)
	hc := &http.Client{Timeout: 5 * time.Second}
	call := func(ctx context.Context, path string, q url.Values) ([]byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, provider+path+"?"+q.Encode(), nil)
		if err != nil {
			return nil, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("provider: %s", resp.Status)
		}
		return b, err
	}
	handler := func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
		body, err := a.Step(ctx, "charge", func(ctx context.Context) ([]byte, error) {
			return call(ctx, "/charge", url.Values{"key": {a.Key("charge")}, "token": {strconv.FormatInt(a.Token, 10)}})
		})
		if err != nil {
			return idem.Result{}, err
		}
		if p, ok := ctx.Value(tokenKey{}).(*int64); ok {
			*p = a.Token
		}
		return idem.Result{Body: body}, nil
	}
	bound := idem.BindLease(lc, handler)
	p := idem.ProcessorFunc(func(ctx context.Context, m idem.Message) (idem.Outcome, error) {
		var token int64
		out, err := bound.Process(context.WithValue(ctx, tokenKey{}, &token), m)
		if err == nil && out.Status == idem.Processed {
			// Reported before the ack; a report lost to a kill is not
			// a violation (the check counts reports that exist).
			_, _ = call(context.WithoutCancel(ctx), "/completed", url.Values{"id": {m.ID}, "token": {strconv.FormatInt(token, 10)}})
		}
		return out, err
	})
	sc, err := idemredisstream.NewConsumer(rdb, idemredisstream.Config{Processor: p, Stream: redisIn, Group: "soak",
		Consumer: fmt.Sprintf("c-%d", os.Getpid()), DeadLetter: redisDead, Concurrency: 4,
		MinIdle: 2 * time.Second, ClaimInterval: 200 * time.Millisecond, RetryDelay: 200 * time.Millisecond,
		Block: time.Second, Logger: log})
	if err != nil {
		return err
	}
	return ran(sc.Run(ctx))
}

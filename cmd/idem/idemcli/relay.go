package idemcli

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"go.opentelemetry.io/otel/metric"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemamqp"
	"github.com/idem-go/idem/broker/idemkafka"
	"github.com/idem-go/idem/broker/idemnats"
	"github.com/idem-go/idem/broker/idemredisstream"
	"github.com/idem-go/idem/cmd/idem/internal/secret"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemotel"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/idem-go/idem/store/idemsql"
)

func newRelayCmd() *cobra.Command {
	var (
		sf          storeFlags
		broker      string
		exchange    string
		metricsAddr string
		cfg         idem.RelayConfig
	)
	cmd := &cobra.Command{
		Use:   "relay",
		Short: "Send the outbox's messages to a broker",
		Long: `relay runs an outbox relay until interrupted: it claims the pending rows of
the store's outbox table (<table>_outbox), publishes them to the broker with
their message IDs, and marks them sent once the broker confirmed. Several
relays may run on one store. On PostgreSQL the relay LISTENs on the outbox
table's channel (through pgx; the table's trigger NOTIFYs on every commit
that inserted rows), so it sends at once without polling tightly; it still
polls every --max-poll for rows whose retry time came. LISTEN needs a session
of its own: through PgBouncer in transaction pooling, point --store at the
server. MariaDB and SQLite are polled (from --min-poll, doubling to
--max-poll while idle). Messages the broker did not take are logged at warn
(one line per destination and round, with the error) and retried with
backoff; one refused for good is marked failed (idem failed --outbox).

Metrics (idemotel's outbox metrics: idem.outbox.sent, idem.outbox.send_failures,
idem.outbox.relay.duration, idem.outbox.relay.lag, and the backlog gauges
idem.outbox.pending, .failed, .oldest_pending) are served for Prometheus
with --metrics-addr, and exported over OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT
is set (the standard OTEL_* variables; OTEL_SERVICE_NAME defaults to
idem-relay).

--broker names the broker and what a row's destination means there:
  nats://HOST:PORT          JetStream; destination = subject
  kafka://HOST:PORT,...     Kafka; destination = topic, ordering key = record key
  amqp://USER:PASS@HOST/    RabbitMQ; destination = routing key on --exchange
                            (default exchange: the queue name)
  redis://HOST:PORT/DB      Redis Streams; destination = stream key`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			st, err := sf.openExisting(ctx)
			if err != nil {
				return err
			}
			defer st.db.Close()
			store, how, closeStore, err := relayStore(ctx, st, sf.store, sf.table)
			if err != nil {
				return err
			}
			defer closeStore()
			pub, closeBroker, err := openPublisher(ctx, broker, exchange)
			if err != nil {
				return err
			}
			defer closeBroker()
			hooks, closeMetrics, err := relayMetrics(ctx, metricsAddr, store, broker)
			if err != nil {
				return err
			}
			defer closeMetrics()
			cfg.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			cfg.Store, cfg.Publisher, cfg.Hooks = store, loggedPublisher{pub, cfg.Logger}, hooks
			r, err := idem.NewRelay(cfg)
			if err != nil {
				return usageError{err}
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "relaying the outbox of %s to %s (%s)\n", st.where, redact(broker), how)
			return r.Run(ctx)
		},
	}
	sf.add(cmd)
	cmd.Flags().StringVar(&broker, "broker", "", "broker URL: nats://..., kafka://..., amqp://..., redis://... (required)")
	cmd.Flags().StringVar(&exchange, "exchange", "", "RabbitMQ exchange to publish to (default: the default exchange)")
	cmd.Flags().IntVar(&cfg.BatchSize, "batch-size", idem.DefaultRelayBatchSize, "rows claimed per round (0: the default)")
	cmd.Flags().IntVar(&cfg.Workers, "workers", idem.DefaultRelayWorkers, "rounds (claim, publish, mark) kept in flight (0: the default)")
	cmd.Flags().DurationVar(&cfg.Lease, "lease", idem.DefaultRelayLease, "how long claimed rows stay leased to this relay")
	cmd.Flags().BoolVar(&cfg.KeepSent, "keep-sent", false, "keep sent rows, marked sent, until --retention has passed (default: delete each row once the broker confirmed it)")
	cmd.Flags().DurationVar(&cfg.Retention, "retention", idem.DefaultOutboxRetention, "how long failed rows (and sent rows, with --keep-sent) are kept before purging")
	cmd.Flags().DurationVar(&cfg.MinPoll, "min-poll", idem.DefaultRelayMinPoll, "wait between polls while rows keep coming")
	cmd.Flags().DurationVar(&cfg.MaxPoll, "max-poll", idem.DefaultRelayMaxPoll, "longest wait between polls of an idle outbox (with LISTEN: how late a row whose retry time came is seen)")
	cmd.Flags().StringVar(&metricsAddr, "metrics-addr", "", "serve Prometheus metrics of the relay (idem_outbox_sent_total, idem_outbox_relay_lag_seconds, ...) on http://ADDR/metrics, e.g. 127.0.0.1:9464 (default: off)")
	return cmd
}

// relayStore returns the outbox the relay runs on, how it learns of new
// rows, and what closes it: on PostgreSQL the pgx store over a pool of
// its own (idempgxv5, an idemdriver.OutboxNotifier: LISTEN/NOTIFY), else
// (another database, or PostgreSQL behind a pooler such as PgBouncer)
// st's store, polled.
func relayStore(ctx context.Context, st *sqlStore, rawURL, table string) (_ idemdriver.OutboxStore, how string, _ func(), err error) {
	if st.dialect != idemsql.Postgres {
		return st.store, "polling", func() {}, nil
	}
	if st.pooler {
		// A pooler in transaction mode hands each transaction to any
		// server connection: a LISTEN would be made on one and heard by
		// nobody. Poll through st, which runs without the session
		// settings the pooler refuses.
		return st.store, "polling: no LISTEN through a pooler", func() {}, nil
	}
	defer func() { err = secret.Error(err, rawURL) }()
	s, pool, err := openPgxStore(ctx, rawURL, st.where, table)
	if err != nil {
		return nil, "", nil, err
	}
	return s, "LISTEN/NOTIFY", pool.Close, nil
}

// openPgxStore opens the pgx store (idempgxv5) of table on PostgreSQL at
// rawURL (where names it in errors), over a pool of its own with the
// store's session settings; it does not migrate. The caller closes the
// pool.
func openPgxStore(ctx context.Context, rawURL, where, table string) (*idempgxv5.Store, *pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(rawURL)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: store %q: %v", errBadURL, redact(rawURL), err)
	}
	pgStoreSettings(pcfg.ConnConfig)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, nil, fmt.Errorf("open %s: %w", where, err)
	}
	s, err := idempgxv5.New(pool, &idempgxv5.Config{Table: table})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return s, pool, nil
}

// relayMetrics returns the hooks that record the relay's outbox metrics
// (idemotel.NewOutboxObserver, with store's backlog gauges) on the
// Prometheus server of addr ("" for none) and on the OTLP export the
// environment asks for (none without OTEL_EXPORTER_OTLP_ENDPOINT), and
// what stops them.
func relayMetrics(ctx context.Context, addr string, store idemdriver.OutboxStore, broker string) (_ []idem.Hook, _ func(), err error) {
	var closers []func()
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	defer func() {
		if err != nil {
			closeAll()
		}
	}()
	var mps []metric.MeterProvider
	if addr != "" {
		m, err := serveMetrics(addr)
		if err != nil {
			return nil, nil, err
		}
		closers = append(closers, func() { _ = m.close() })
		mps = append(mps, m.meterProvider)
	}
	otlp, err := setupOTLP(ctx, "idem-relay")
	if err != nil {
		return nil, nil, err
	}
	if otlp != nil {
		closers = append(closers, func() {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = otlp.close(sctx)
		})
		if otlp.mp != nil {
			mps = append(mps, otlp.mp)
		}
	}
	var hooks []idem.Hook
	for _, mp := range mps {
		obs, err := idemotel.NewOutboxObserver(store, idemotel.WithMeterProvider(mp), idemotel.WithMessagingSystem(brokerSystem(broker)))
		if err != nil {
			return nil, nil, err
		}
		closers = append(closers, func() { _ = obs.Close() })
		hooks = append(hooks, obs)
	}
	return hooks, closeAll, nil
}

// brokerSystem is the messaging.system of a broker URL, by its scheme.
func brokerSystem(url string) string {
	scheme, _, _ := strings.Cut(url, ":")
	switch scheme {
	case "amqp", "amqps":
		return "rabbitmq"
	case "rediss":
		return "redis"
	}
	return scheme
}

// openPublisher connects to the broker at url and returns its relay
// Publisher and a function that closes the connection.
func openPublisher(ctx context.Context, url, exchange string) (idem.Publisher, func(), error) {
	switch {
	case url == "":
		return nil, nil, usageError{fmt.Errorf("--broker is required (or IDEM_BROKER)")}
	case strings.HasPrefix(url, "nats:"):
		js, err := dialNATS(url)
		if err != nil {
			return nil, nil, fmt.Errorf("cannot reach NATS at %s: %w", redact(url), err)
		}
		return idemnats.NewPublisher(js), js.Conn().Close, nil
	case strings.HasPrefix(url, "kafka:"):
		cl, err := dialKafka(ctx, strings.Split(strings.TrimPrefix(strings.TrimPrefix(url, "kafka://"), "kafka:"), ","))
		if err != nil {
			return nil, nil, err
		}
		return idemkafka.NewPublisher(cl, idemkafka.ProducerConfig{}), cl.Close, nil
	case strings.HasPrefix(url, "amqp:") || strings.HasPrefix(url, "amqps:"):
		conn, err := dialAMQP(url)
		if err != nil {
			return nil, nil, fmt.Errorf("cannot reach RabbitMQ at %s: %w", redact(url), err)
		}
		pub := idemamqp.NewPublisher(conn, idemamqp.ProducerConfig{Exchange: exchange})
		return pub, func() { _ = pub.Close(); _ = conn.Close() }, nil
	case strings.HasPrefix(url, "redis:") || strings.HasPrefix(url, "rediss:"):
		client, _, err := dialRedis(ctx, url)
		if err != nil {
			return nil, nil, err
		}
		return idemredisstream.NewPublisher(client, idemredisstream.ProducerConfig{}), func() { _ = client.Close() }, nil
	}
	return nil, nil, usageError{fmt.Errorf("%w: --broker %q: want nats://HOST:PORT, kafka://HOST:PORT, amqp://USER:PASS@HOST:PORT/ or redis://HOST:PORT/DB", errBadURL, redact(url))}
}

// loggedPublisher is a Publisher that logs, at warn, the messages of each
// batch that it could not send: one line per destination, with their count
// and the first error. The relay itself only retries them (or marks them
// failed, for a permanent error), so without it `idem relay` said nothing
// while a row waited for, say, a NATS subject that no stream captures.
type loggedPublisher struct {
	idem.Publisher
	log *slog.Logger
}

func (p loggedPublisher) Publish(ctx context.Context, msgs []idem.Outgoing) []error {
	errs := p.Publisher.Publish(ctx, msgs)
	if len(errs) != len(msgs) {
		return errs // the relay retries the whole batch and says why
	}
	type failure struct {
		n     int
		first error
	}
	var order []string
	failed := map[string]*failure{}
	for i, err := range errs {
		if err == nil {
			continue
		}
		f := failed[msgs[i].Destination]
		if f == nil {
			f = &failure{first: err}
			failed[msgs[i].Destination] = f
			order = append(order, msgs[i].Destination)
		}
		f.n++
	}
	for _, dest := range order {
		f := failed[dest]
		then := "retried with backoff"
		if idem.IsPermanent(f.first) {
			then = "failed for good: idem failed --outbox lists them, idem retry --outbox-id sends one again"
		}
		p.log.Warn("idem relay: messages not sent", "destination", dest, "messages", f.n, "then", then, "error", f.first)
	}
	return errs
}

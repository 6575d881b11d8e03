package idemcli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime/debug"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemkafka"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/internal/leasebatch"
)

// consumeFlags are the flags of `idem consume`.
type consumeFlags struct {
	leaseStoreFlags
	broker, from, to                     string
	consumer, group, deadLetter          string
	healthAddr, metricsAddr              string
	concurrency, maxAttempts, storeBatch int
	hold                                 int
	atLeastOnce, pointAtCall             bool
	batchClaim                           bool
	lease, timeout, retryBase, retryMax  time.Duration
	retryDelay, ackWait, natsDuplicates  time.Duration
	shutdownTimeout                      time.Duration
	kafkaInstanceID, kafkaOrder          string
	log                                  logFlags
	profile                              profileFlags
}

// The recovery defaults of `idem consume` (see its --help): a SIGKILLed
// sidecar's messages come back within a few seconds of its restart.
const (
	// defaultConsumeLease is --lease: a record's lease, renewed every
	// third of it (every second) while its message is held.
	defaultConsumeLease = 3 * time.Second
	// defaultConsumeAckWait is --ack-wait: NATS AckWait and Redis Streams
	// min-idle time, each kept alive every third of it while held.
	defaultConsumeAckWait = 3 * time.Second
	// minKafkaSessionTimeout is the session timeout used on Kafka when
	// --ack-wait is shorter: Kafka's group.min.session.timeout.ms default.
	minKafkaSessionTimeout = 6 * time.Second
	// consumeGCPercent is the garbage collector's target of `idem consume`
	// when GOGC is not set: its live heap is small (the messages held)
	// and it allocates a few kilobytes per message, so at Go's 100 it
	// collected every few hundred messages; 400 collects a fifth as often
	// for a heap goal of five times the live heap, not two.
	consumeGCPercent = 400
)

func newConsumeCmd() *cobra.Command {
	var f consumeFlags
	cmd := &cobra.Command{
		Use:   "consume",
		Short: "Deliver each message of a broker to an HTTP service once (a sidecar)",
		Long: `consume is an Idempotent Consumer for a service in any language: it consumes
--from on --broker with idem's adapters and POSTs each message to --to, once.

  idem consume --broker nats://127.0.0.1:4222 --from orders.created \
               --to http://127.0.0.1:9000/orders --store sqlite:/var/lib/idem/orders.db

Each request carries the payload as its body and these headers:
  Idempotency-Key, Idem-Message-Id   the producer's message ID
  Idem-Attempt                       1, then 2, ... for retries and takeovers
  Idem-Deadline                      when the sidecar stops waiting (RFC 3339)
  Idem-Header-<Name>                 each broker header (NATS and Kafka headers, AMQP
                                     header table, Redis Streams fields); a Content-Type
                                     header is also the request's Content-Type

Answers:
  2xx              recorded, then the message is acknowledged; a redelivery is
                   acknowledged without calling the service
  409, 429, 5xx    redelivered after a backoff (--retry-base doubling up to
                   --retry-max) or the Retry-After asked for; after --max-attempts,
                   dead-lettered with reason poison
  other statuses   recorded and dead-lettered, reason permanent, with the answer
  no connection    redelivered after the backoff

At most once by default: before a request leaves, a recovery point is
recorded, so if the sidecar dies (or the connection breaks) after sending,
the message is not sent again but dead-lettered with reason outcome-unknown.
--at-least-once sends it again instead, for services that deduplicate by
Idempotency-Key. Dead letters go to --dead-letter with the headers
Idem-Dead-Letter-Reason and Idem-Dead-Letter-Error.

--broker: nats://HOST:PORT (JetStream; a stream is created for a subject no
stream captures), kafka://HOST:PORT[,HOST:PORT], amqp://USER:PASS@HOST:PORT/
(durable queues), redis://HOST:PORT/DB (Redis Streams, consumer group --group),
or the start of a Go CDK URL, gcppubsub://, awssqs:// or mem://, whose end is
--from (projects/P/subscriptions/S; sqs.REGION.amazonaws.com/ACCOUNT/QUEUE?region=REGION)
and --dead-letter (default: a topic projects/P/topics/S-dead on Pub/Sub, the
queue QUEUE-dead on SQS); credentials come from the environment, as the Go
CDK's drivers read them. mem:// topics live inside one process (tests and
examples): idem publish in another process reaches nothing.
--store: sqlite:PATH, postgres://..., mysql://..., or Redis (lease mode).
` + redisStoreHelp + `
A message costs two store writes: the claim, which also records the recovery
point, and the result. The claims (and the results) of the messages that reach
the store together go as one batch, one commit and one round trip on
PostgreSQL (one commit behind a pooler such as PgBouncer), one commit on
SQLite and MySQL, one pipeline on Redis (--store-batch, the most per batch).
The sidecar holds up to --hold messages: each is claimed as the broker hands
it over, and waits claimed, its lease renewed, for one of the --concurrency
calls. At most once (the default), a message claimed and waiting when the
sidecar is killed is dead-lettered as outcome-unknown, like one whose call was
running, so --hold defaults to --concurrency there: only what is called is
claimed. With --at-least-once it defaults to --store-batch when the store
takes batches, since a held message is then simply sent after a crash. A
larger --hold at most once buys throughput with more outcome-unknown dead
letters after a crash, unless --point-at-call: a message that waits for a
call then records its recovery point when it gets one, in a store write of
its own (not batched), so a held message that was never called is sent after
a crash; that third write per waiting message can cost more than half the
throughput that --hold bought.

Logging: one line per message at info on stderr (--log-format text or json):
message_id, system and destination (the broker and where the message came
from), outcome (Processed, Duplicate, InProgress, Failed, ...), action (Ack,
Redeliver, DeadLetter), reason, attempt, delay_ms of a redelivery,
duration_ms, and for a failure service_status (the service's answer) or
error. That line holds no payload, no header value and no answer body. A
failure the service answered is also logged at warn by the broker adapter,
and kept as the record's last error (what idem failed shows), with the start
of the service's answer (at most 512 bytes): a service must not put secrets
in its error answers.

Recovery after a crash: a message the sidecar held when it died comes back
about 3s later, to its restart or to another sidecar of the group, because
the two things that hold it back are short and kept alive while the sidecar
lives:
  --lease 3s       the message's record: renewed every second (a third of
                   it) while the message is held, by one scheduler for all
                   of them; a dead sidecar's lease runs out within 3s
  --ack-wait 3s    the broker's hold: NATS AckWait, kept alive by an
                   in-progress ack (AckProgress) every second, for every
                   held message, by one reporter; Redis Streams: the idle
                   time after which XAUTOCLAIM takes the entry, kept alive
                   by one XCLAIM of the entries in flight each second;
                   Kafka: the session timeout, at least 6s (Kafka's
                   smallest by default); RabbitMQ needs none: the broker
                   requeues a dead connection's unacknowledged messages;
                   the Go CDK ignores it: the subscription's own ack
                   deadline (set on Pub/Sub or SQS) holds the message,
                   and is not extended
On Kafka a restarted sidecar gets its partitions back only after the old
member's session timeout (6s or more) unless --kafka-instance-id names it:
then it is a static member and takes its partitions back at once, without a
rebalance. Give each sidecar of a group its own stable name, such as its pod
name: two live members with one name fence each other. A static member does
not leave the group when it stops, even on SIGTERM: its partitions wait for
its return, or its session timeout, before another member gets them.
On Kafka the records of one partition go one at a time, in offset order, by
default (--kafka-order partition): --hold then bounds the partitions served at
once, and a topic of 8 partitions has at most 8 messages in flight, whatever
--hold says. --kafka-order key runs records of one partition whose keys differ
at once, up to --hold messages in flight over all partitions, and records with
the same key (byte for byte; records without a key count as one key) one at a
time, in offset order: each entity's events keep their order, events of
different entities do not. A partition's offset is committed only up to its
first record not done, so a slow or retried record holds back the commit
(after a crash the records done behind it come back as duplicates, which are
not sent again) and only the later records of its own key. The other brokers
keep no order under --concurrency or --hold above 1: JetStream, RabbitMQ, Redis
Streams and the Go CDK's subscriptions hand up to --hold messages over at once,
in no particular order.
The price of the short defaults: a message held for longer than a second
costs a lease renewal (a store write of its own) and an in-progress ack each
second (one done sooner costs neither); and a store that stalls for more than
about 2s (the lease less a renewal period) costs the leases of the messages
held: their calls are cancelled, and a call already sent is then, at most
once, dead-lettered as outcome-unknown. On a slow or distant store, raise
--lease. On Redis Streams a redelivery waits at most --ack-wait (the idle
time is all that delays XAUTOCLAIM), so a longer backoff (--retry-max) or
Retry-After is cut to it there: raise --ack-wait for a service that asks for
longer pauses; elsewhere a longer --ack-wait only delays the return of a dead
sidecar's messages. Fencing still holds: a sidecar that was only stalled,
not dead, cannot record a result once its lease was taken over. On a SQLite
store, one file shared by sidecars on one machine, a sidecar that is frozen
(SIGSTOP, a paused container) while it writes holds the file's write lock:
the others can write nothing until it resumes or dies.

GET /healthz on --health-addr answers 200 {"status":"ok"} or 503
{"status":"unavailable"} from the store and broker connections.
--metrics-addr serves Prometheus metrics on http://ADDR/metrics. On SIGINT or
SIGTERM the deliveries in flight finish (up to --shutdown-timeout).

Unless GOGC is set in the environment, the Go garbage collector runs with
GOGC=400 (Go's default is 100): fewer collections, for a heap of up to five
times the live data instead of twice.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runConsume(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), &f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.broker, "broker", "", "broker URL: nats://..., kafka://..., amqp://..., redis://..., or a Go CDK URL: gcppubsub://..., awssqs://..., mem://... (in this process only) (required)")
	fl.StringVar(&f.from, "from", "", "NATS subject, Kafka topic, RabbitMQ queue or Redis stream to consume (required)")
	fl.StringVar(&f.to, "to", "", "URL each message is POSTed to, as in http://127.0.0.1:9000/orders (required)")
	f.leaseStoreFlags.register(fl)
	fl.StringVar(&f.consumer, "consumer", "", "consumer name: deduplication is per name (default consume:FROM)")
	fl.StringVar(&f.group, "group", "idem-consume", "NATS durable consumer, Kafka consumer group or Redis Streams group")
	fl.StringVar(&f.deadLetter, "dead-letter", "", "where dead letters go (default FROM.dead on NATS, FROM-dead elsewhere)")
	fl.IntVar(&f.concurrency, "concurrency", 8, "messages delivered at a time")
	fl.IntVar(&f.storeBatch, "store-batch", 64, "most messages claimed, or completed, in one store commit: the claims (and completions) of the messages in flight that reach the store together go as one batch; 1 sends each alone")
	fl.IntVar(&f.hold, "hold", 0, "most messages held at once, claimed and running or waiting for one of the --concurrency calls (default --concurrency; with --at-least-once, --store-batch when the store takes batches)")
	fl.IntVar(&f.maxAttempts, "max-attempts", idem.DefaultMaxAttempts, "attempts of a message before it is dead-lettered as poison")
	fl.BoolVar(&f.pointAtCall, "point-at-call", false, "at most once, a held message waiting for one of the --concurrency calls records its recovery point when it gets the call (a store write of its own), not with its claim: after a crash it is sent, not dead-lettered as outcome-unknown")
	fl.BoolVar(&f.atLeastOnce, "at-least-once", false, "send a message whose outcome is unknown again instead of dead-lettering it (for services that deduplicate by Idempotency-Key)")
	fl.DurationVar(&f.lease, "lease", defaultConsumeLease, "lease of a message's record while it is held, renewed every third of it; after a crash, the message waits at most this long")
	fl.DurationVar(&f.timeout, "timeout", idemhttp.DefaultDeliveryTimeout, "time for the service to answer one message (Idem-Deadline)")
	fl.DurationVar(&f.retryBase, "retry-base", idemhttp.DefaultDeliveryRetryBase, "first redelivery delay after a retryable answer, doubling with each attempt")
	fl.DurationVar(&f.retryMax, "retry-max", idemhttp.DefaultDeliveryRetryMax, "longest backoff (a longer Retry-After is honoured)")
	fl.DurationVar(&f.retryDelay, "retry-delay", time.Second, "redelivery delay after a failure of the store")
	fl.DurationVar(&f.ackWait, "ack-wait", defaultConsumeAckWait, "how long a delivery of a dead sidecar waits before the broker gives it again (NATS AckWait and Redis Streams idle time, both kept alive every third of it while the message is held; Kafka session timeout, at least 6s)")
	fl.StringVar(&f.kafkaOrder, "kafka-order", "partition", "order kept among the records of a Kafka partition: partition (one at a time, in offset order) or key (records with different keys at once, up to --hold; the same key in offset order)")
	fl.StringVar(&f.kafkaInstanceID, "kafka-instance-id", "", "Kafka static member name (group.instance.id), stable across restarts and unique in the group: a restarted sidecar takes its partitions back at once (default: a dynamic member)")
	fl.DurationVar(&f.natsDuplicates, "nats-duplicates", 2*time.Minute, "JetStream's duplicate window of a stream this command creates")
	fl.DurationVar(&f.shutdownTimeout, "shutdown-timeout", 30*time.Second, "how long deliveries in flight may take to finish at shutdown")
	fl.StringVar(&f.healthAddr, "health-addr", "", "serve GET /healthz on ADDR, e.g. 127.0.0.1:8081 (default: off)")
	fl.StringVar(&f.metricsAddr, "metrics-addr", "", "serve Prometheus metrics on http://ADDR/metrics, e.g. 127.0.0.1:9464 (default: off)")
	fl.BoolVar(&f.batchClaim, "batch-claim", false, "NATS, Redis Streams and Kafka (new, not yet the default): each batch of messages the broker hands over (a pull request's; one XREADGROUP's or XAUTOCLAIM's; a partition's poll) is claimed in one store call and its answers recorded in one more (idemhttp.Deliverer.ProcessBatch). NATS and Redis Streams: --hold messages held in two batches at a time (one on SQLite, which writes one transaction at a time), --concurrency calls at once. Kafka (partition order only): --concurrency partitions at once, each a batch of --hold/--concurrency records called one at a time in offset order, a retried record retried in place before the next")
	f.log.register(fl, "message")
	f.profile.register(fl)
	return cmd
}

// check validates the flags (usage errors, exit status 2).
func (f *consumeFlags) check() (*url.URL, error) {
	for _, r := range []struct{ name, v string }{{"broker", f.broker}, {"from", f.from}, {"to", f.to}, {"store", f.store}} {
		if r.v == "" {
			return nil, usageError{fmt.Errorf("--%s is required (or IDEM_%s)", r.name, envName(r.name))}
		}
	}
	u, err := url.Parse(f.to)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, usageError{fmt.Errorf("--to %q: want an absolute http:// or https:// URL", redact(f.to))}
	}
	for _, a := range []struct{ name, v string }{{"health-addr", f.healthAddr}, {"metrics-addr", f.metricsAddr}} {
		if a.v == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(a.v); err != nil {
			return nil, usageError{fmt.Errorf("--%s %q: want host:port: %v", a.name, a.v, err)}
		}
	}
	if f.storeBatch < 1 || f.storeBatch > idemdriver.MaxLeaseBatch {
		return nil, usageError{fmt.Errorf("--store-batch must be 1 to %d", idemdriver.MaxLeaseBatch)}
	}
	if f.concurrency < 1 {
		return nil, usageError{errors.New("--concurrency must be at least 1")}
	}
	if f.hold != 0 && (f.hold < f.concurrency || f.hold > idemdriver.MaxLeaseBatch) {
		return nil, usageError{fmt.Errorf("--hold must be --concurrency (%d) to %d", f.concurrency, idemdriver.MaxLeaseBatch)}
	}
	if f.maxAttempts < 1 {
		return nil, usageError{errors.New("--max-attempts must be at least 1")}
	}
	if f.ackWait < time.Second {
		return nil, usageError{errors.New("--ack-wait must be at least 1s")}
	}
	if f.pointAtCall && f.atLeastOnce {
		return nil, usageError{errors.New("--point-at-call is for at most once: --at-least-once records no recovery point")}
	}
	if f.kafkaInstanceID != "" && !isKafkaURL(f.broker) {
		return nil, usageError{errors.New("--kafka-instance-id is for a kafka:// broker")}
	}
	if f.kafkaOrder != idemkafka.OrderPartition.String() && f.kafkaOrder != idemkafka.OrderKey.String() {
		return nil, usageError{fmt.Errorf("--kafka-order %q: want partition or key", f.kafkaOrder)}
	}
	if f.kafkaOrder != idemkafka.OrderPartition.String() && !isKafkaURL(f.broker) {
		return nil, usageError{errors.New("--kafka-order is for a kafka:// broker")}
	}
	if f.batchClaim && !batchClaimBroker(f.broker) {
		return nil, usageError{errors.New("--batch-claim is for a nats://, redis:// (Redis Streams) or kafka:// broker")}
	}
	if f.batchClaim && f.kafkaOrder == idemkafka.OrderKey.String() {
		// A batch is consecutive records of one partition, called in
		// offset order; the records' keys do not reach the Deliverer.
		return nil, usageError{errors.New("--batch-claim keeps partition order on Kafka: it does not take --kafka-order key")}
	}
	return u, nil
}

// runConsume runs the sidecar until ctx ends, then stops it gracefully.
func runConsume(ctx context.Context, stdout, stderr io.Writer, f *consumeFlags) error {
	target, err := f.check()
	if err != nil {
		return err
	}
	if f.consumer == "" {
		f.consumer = "consume:" + f.from
	}
	if f.deadLetter == "" {
		f.deadLetter = defaultDeadLetter(f.broker, f.from)
	}
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(consumeGCPercent)
	}
	stopProfile, err := f.profile.start()
	if err != nil {
		return err
	}
	defer func() {
		if perr := stopProfile(); perr != nil {
			fmt.Fprintf(stderr, "idem consume: %v\n", perr)
		}
	}()
	logger, err := f.log.newLogger(stderr)
	if err != nil {
		return err
	}
	ps, err := f.leaseStoreFlags.open(ctx)
	if err != nil {
		return err
	}
	defer ps.close()
	b, err := openSidecarBroker(ctx, f.broker, f.natsDuplicates)
	if err != nil {
		return err
	}
	defer b.close()

	var metrics *metricsServer
	if f.metricsAddr != "" {
		if metrics, err = serveMetrics(f.metricsAddr); err != nil {
			return err
		}
		defer metrics.close()
	}
	store := ps.store
	hold := f.concurrency
	if b, ok := store.(idemdriver.LeaseBatcher); ok && f.storeBatch > 1 {
		// The claims and completions of the messages held go to the
		// store together: one commit per batch, not per message.
		lb := leasebatch.New(b, f.storeBatch)
		f.profile.storeStats = lb.Stats
		store = lb
		if f.atLeastOnce {
			// At least once, a held message that was never called is
			// simply sent after a crash; at most once it would be
			// dead-lettered as outcome-unknown (unless
			// --point-at-call, which costs a write of its own), so by
			// default only what is called is claimed.
			hold = max(hold, f.storeBatch)
		}
	}
	if f.hold != 0 {
		hold = f.hold
	}
	// The store's calls are batched by --store-batch (leasebatch), not
	// by the consumer (Config.Coalesce 1).
	lc, err := idem.NewLeaseConsumer(store, idem.Config{Name: f.consumer, Lease: f.lease, MaxAttempts: f.maxAttempts, Coalesce: 1,
		Hooks: metrics.hooks(), Logger: logger})
	if err != nil {
		return usageError{err}
	}
	defer lc.Close()
	// The adapter runs hold deliveries at once, each claimed as it
	// arrives; the Deliverer lets --concurrency of them call the service.
	d, err := idemhttp.NewDeliverer(lc, idemhttp.DelivererOptions{Target: target, Timeout: f.timeout, AtLeastOnce: f.atLeastOnce,
		MaxCalls: f.concurrency, PointAtCall: f.pointAtCall, RetryBase: f.retryBase, RetryMax: f.retryMax, Logger: logger,
		// A Kafka batch is consecutive records of one partition.
		InOrder: f.batchClaim && isKafkaURL(f.broker)})
	if err != nil {
		return usageError{err}
	}
	cc := consumeConfig{group: f.group, deadLetter: f.deadLetter,
		concurrency: hold, calls: f.concurrency, retryDelay: f.retryDelay, ackWait: f.ackWait, kafkaInstanceID: f.kafkaInstanceID,
		kafkaKeyOrder: f.kafkaOrder == idemkafka.OrderKey.String(), logger: logger}
	if f.batchClaim {
		cc.batch, cc.batchesAtOnce = logBatches(logger, f.retryDelay, d), batchesAtOnce(f.store)
	}
	run, stop, err := b.consume(ctx, f.from, logMessages(logger, f.retryDelay, d), cc)
	if err != nil {
		return err
	}

	if f.healthAddr != "" {
		hs, err := serveHealth(f.healthAddr, func(ctx context.Context) bool {
			return ps.ping(ctx) == nil && b.healthy(ctx)
		})
		if err != nil {
			return err
		}
		defer hs.close()
		fmt.Fprintf(stdout, "idem consume: health on http://%s/healthz\n", hs.addr)
	}
	mode := "at most once"
	if f.atLeastOnce {
		mode = "at least once"
	}
	fmt.Fprintf(stdout, "idem consume: %s from %s on %s to %s (%s), records in %s, dead letters to %s\n",
		f.consumer, f.from, b.where(), redact(f.to), mode, ps.where, f.deadLetter)
	if metrics != nil {
		fmt.Fprintf(stdout, "idem consume: metrics on %s\n", metrics.url())
	}

	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- run(rctx) }()
	select {
	case err := <-errc:
		return fmt.Errorf("consume: %w", err)
	case <-ctx.Done():
	}
	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), f.shutdownTimeout)
	defer scancel()
	// A record retried in place (--batch-claim on Kafka) is left to the
	// next run, as a retry wait is, instead of holding the stop.
	d.EndRetries()
	serr := stop(sctx)
	cancel()
	<-errc
	st := d.Stats()
	fmt.Fprintf(stdout, "idem consume: stopped: %d delivered, %d replayed without a call, %d refused, %d outcome unknown, %d left for retry\n",
		st.Delivered, st.Replayed, st.Refused, st.Unknown, st.Retried)
	if serr != nil {
		return fmt.Errorf("shutdown: deliveries still running after %v: %w", f.shutdownTimeout, serr)
	}
	return nil
}

// leaseStoreFlags are the flags of a command that opens a lease-mode
// store (the proxy's set: --store, --table, --redis-prefix, --migrate).
type leaseStoreFlags struct {
	store, table, redisPrefix string
	migrate                   bool
}

func (f *leaseStoreFlags) register(fl *pflag.FlagSet) {
	fl.StringVar(&f.store, "store", "", "store URL: sqlite:PATH, postgres://..., mysql://..., redis://..., redis-sentinel://..., redis-cluster://... (required)")
	fl.StringVar(&f.table, "table", "", "records table of a SQL store (default idem_processed)")
	fl.StringVar(&f.redisPrefix, "redis-prefix", "idem:", "key prefix of a Redis store")
	fl.BoolVar(&f.migrate, "migrate", true, "create or upgrade the SQL store's tables at start")
}

// open opens the store (see openProxyStore; on PostgreSQL the pgx store,
// whose lease batches are one round trip).
func (f *leaseStoreFlags) open(ctx context.Context) (*proxyStore, error) {
	return openProxyStore(ctx, f.store, f.table, f.redisPrefix, f.migrate, true)
}

// envName is the environment variable of a flag.
func envName(flag string) string {
	b := []byte(flag)
	for i, c := range b {
		switch {
		case c == '-':
			b[i] = '_'
		case c >= 'a' && c <= 'z':
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}

// healthServer serves GET /healthz: 200 {"status":"ok"} when healthy
// answers true, 503 {"status":"unavailable"} otherwise, never an error
// text (which could name a host or a user).
type healthServer struct {
	addr string
	srv  *http.Server
	done chan struct{}
}

func serveHealth(addr string, healthy func(ctx context.Context) bool) (*healthServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--health-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), idemhttp.DefaultHealthTimeout)
		defer cancel()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if !healthy(ctx) {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, `{"status":"unavailable"}`+"\n")
			return
		}
		_, _ = io.WriteString(w, `{"status":"ok"}`+"\n")
	})
	h := &healthServer{addr: ln.Addr().String(), srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, done: make(chan struct{})}
	go func() {
		defer close(h.done)
		_ = h.srv.Serve(ln)
	}()
	return h, nil
}

func (h *healthServer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = h.srv.Shutdown(ctx)
	<-h.done
}

// logMessages logs one line at info for each delivery p processes (see
// the Logging paragraph of `idem consume --help`): what the adapter will do
// with it is the core's decision, Outcome.Settle with the adapter's
// retryDelay. The payload, the headers and a service's answer body (in a
// ServiceAnswerError's text) are never logged.
func logMessages(logger *slog.Logger, retryDelay time.Duration, p idem.Processor) idem.Processor {
	return idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
		if !logger.Enabled(ctx, slog.LevelInfo) {
			return p.Process(ctx, msg)
		}
		start := time.Now()
		out, err := p.Process(ctx, msg)
		logMessage(ctx, logger, retryDelay, msg, out, start)
		return out, err
	})
}

// logBatches is logMessages for a BatchProcessor: one line for each
// message of a batch, its duration the batch's.
func logBatches(logger *slog.Logger, retryDelay time.Duration, p idem.BatchProcessor) idem.BatchProcessor {
	return batchFunc(func(ctx context.Context, msgs []idem.Message) ([]idem.Outcome, error) {
		if !logger.Enabled(ctx, slog.LevelInfo) {
			return p.ProcessBatch(ctx, msgs)
		}
		start := time.Now()
		outs, err := p.ProcessBatch(ctx, msgs)
		for i := range min(len(msgs), len(outs)) {
			logMessage(ctx, logger, retryDelay, msgs[i], outs[i], start)
		}
		return outs, err
	})
}

// batchFunc adapts a function to idem.BatchProcessor.
type batchFunc func(ctx context.Context, msgs []idem.Message) ([]idem.Outcome, error)

// ProcessBatch calls f(ctx, msgs).
func (f batchFunc) ProcessBatch(ctx context.Context, msgs []idem.Message) ([]idem.Outcome, error) {
	return f(ctx, msgs)
}

// logMessage logs the line of msg, whose processing started at start and
// ended with out.
func logMessage(ctx context.Context, logger *slog.Logger, retryDelay time.Duration, msg idem.Message, out idem.Outcome, start time.Time) {
	s := out.Settle(retryDelay)
	attrs := []slog.Attr{slog.String("message_id", msg.ID)}
	if d, ok := idem.DeliveryFromContext(ctx); ok {
		attrs = append(attrs, slog.String("system", d.System), slog.String("destination", d.Destination))
	}
	attrs = append(attrs, slog.String("outcome", out.Status.String()), slog.String("action", s.Action.String()),
		slog.String("reason", s.Reason), slog.Int("attempt", out.Attempt))
	if s.Action == idem.Redeliver {
		attrs = append(attrs, slog.Int64("delay_ms", s.Delay.Milliseconds()))
	}
	attrs = append(attrs, slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000))
	if s.Action != idem.Ack {
		var answer *idemhttp.ServiceAnswerError
		if errors.As(s.Err, &answer) {
			attrs = append(attrs, slog.Int("service_status", answer.Status))
		} else {
			attrs = append(attrs, slog.String("error", s.Err.Error()))
		}
	}
	logger.LogAttrs(ctx, slog.LevelInfo, "message", attrs...)
}

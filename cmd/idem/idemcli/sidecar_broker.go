package idemcli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemamqp"
	"github.com/idem-go/idem/broker/idemkafka"
	"github.com/idem-go/idem/broker/idemnats"
	"github.com/idem-go/idem/broker/idemredisstream"
)

// sidecarBroker is a broker as `idem consume` and `idem publish` use it,
// through idem's adapters: a consumer of one source driving a Processor,
// and a producer that publishes with a stable message ID.
type sidecarBroker interface {
	// consume starts consuming src (a subject, topic, queue or stream)
	// with p; run blocks until ctx ends or stop returns.
	consume(ctx context.Context, src string, p idem.Processor, o consumeConfig) (run, stop func(ctx context.Context) error, err error)
	// publish publishes payload to dst with id as its message ID.
	publish(ctx context.Context, dst, id string, payload []byte) error
	// healthy reports whether the broker connection is up.
	healthy(ctx context.Context) bool
	// where names the broker, without credentials.
	where() string
	close()
}

// consumeConfig is what the adapters of `idem consume` are given.
type consumeConfig struct {
	group, deadLetter string
	concurrency       int // deliveries the adapter runs at once (the messages held)
	calls             int // calls to the service at once (--concurrency)
	retryDelay        time.Duration
	ackWait           time.Duration // NATS AckWait, Redis Streams MinIdle, Kafka session timeout (at least minKafkaSessionTimeout)
	natsDuplicates    time.Duration
	kafkaInstanceID   string // Kafka static member name; "" for a dynamic member
	kafkaKeyOrder     bool   // Kafka: idemkafka.OrderKey, concurrency records in flight; else one partition per slot
	// batch, when set (--batch-claim), takes the batches of messages
	// the broker hands over instead of p. NATS and Redis Streams (a pull
	// request's, an XREADGROUP's or XAUTOCLAIM's): concurrency messages
	// held, in batchesAtOnce batches at a time. Kafka: calls partitions
	// at once, each a batch of concurrency/calls consecutive records
	// (its Deliverer keeps their order: idemhttp.DelivererOptions.InOrder).
	batch         idem.BatchProcessor
	batchesAtOnce int
	logger        *slog.Logger
}

// batchesAtOnce is how many batches --batch-claim processes at once on
// store: two, so that while one batch's answers are recorded the next
// one's are claimed and called; one on SQLite, which admits one writing
// transaction at a time (a second batch's claim would wait for the
// first's write anyway), so that a batch holds every message held and
// its two commits serve twice as many.
func batchesAtOnce(store string) int {
	if strings.HasPrefix(strings.ToLower(store), "sqlite:") {
		return 1
	}
	return 2
}

// batchClaimBroker reports whether the broker URL rawURL names a broker
// whose adapter has a batch mode for --batch-claim: NATS (nats://, tls://),
// Redis Streams (redis://, rediss://) or Kafka (kafka://).
func batchClaimBroker(rawURL string) bool {
	scheme, _, _ := strings.Cut(strings.ToLower(rawURL), ":")
	return scheme == "nats" || scheme == "tls" || scheme == "redis" || scheme == "rediss" || isKafkaURL(rawURL)
}

// openSidecarBroker connects to the broker named by rawURL:
//
//	nats://host:4222                NATS JetStream
//	kafka://host:9092,host:9093     Kafka
//	amqp://user:pass@host:5672/     RabbitMQ (amqps:// too)
//	redis://host:6379/0             Redis Streams (rediss:// too)
//	gcppubsub://, awssqs://, mem:// Go CDK pub/sub (see openGoCDK)
func openSidecarBroker(ctx context.Context, rawURL string, natsDuplicates time.Duration) (sidecarBroker, error) {
	if isGoCDKURL(rawURL) { // gcppubsub://, awssqs://, mem:// (broker_gocdk.go)
		return openGoCDK(rawURL)
	}
	scheme, _, _ := strings.Cut(rawURL, ":")
	switch strings.ToLower(scheme) {
	case "nats", "tls":
		// A connection that stops answering without closing (half-open
		// TCP) is given up after two pings two seconds apart unanswered,
		// not nats.go's default two minutes apart: meanwhile no message
		// is consumed.
		nc, err := nats.Connect(rawURL, nats.Timeout(5*time.Second), nats.MaxReconnects(-1),
			nats.PingInterval(2*time.Second), nats.MaxPingsOutstanding(2))
		if err != nil {
			return nil, fmt.Errorf("cannot reach NATS at %s: %w", redact(rawURL), err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			nc.Close()
			return nil, err
		}
		return &natsSidecar{nc: nc, js: js, prod: idemnats.NewProducer(js), url: rawURL, duplicates: natsDuplicates}, nil
	case "kafka":
		seeds := strings.Split(strings.TrimPrefix(strings.TrimPrefix(rawURL, "kafka://"), "kafka:"), ",")
		cl, err := dialKafka(ctx, seeds)
		if err != nil {
			return nil, err
		}
		return &kafkaSidecar{seeds: seeds, cl: cl, prod: idemkafka.NewProducer(cl, idemkafka.ProducerConfig{})}, nil
	case "amqp", "amqps":
		conn, err := dialAMQP(rawURL)
		if err != nil {
			return nil, fmt.Errorf("cannot reach RabbitMQ at %s: %w", redact(rawURL), err)
		}
		return &amqpSidecar{url: rawURL, conn: conn, prod: idemamqp.NewProducer(conn, idemamqp.ProducerConfig{})}, nil
	case "redis", "rediss":
		rdb, opts, err := dialRedis(ctx, rawURL)
		if err != nil {
			return nil, err
		}
		return &redisSidecar{rdb: rdb, addr: opts.Addr, prod: idemredisstream.NewProducer(rdb, idemredisstream.ProducerConfig{})}, nil
	}
	return nil, usageError{fmt.Errorf("%w: broker %q: want nats://, kafka://, amqp://, redis://, gcppubsub://, awssqs:// or mem://", errBadURL, redact(rawURL))}
}

// isKafkaURL reports whether rawURL names a Kafka broker (kafka://).
func isKafkaURL(rawURL string) bool { return strings.HasPrefix(strings.ToLower(rawURL), "kafka:") }

// defaultDeadLetter names the dead letter of src when --dead-letter is not
// given: SUBJECT.dead on NATS (a subject token), SRC-dead elsewhere.
func defaultDeadLetter(brokerURL, src string) string {
	if strings.HasPrefix(strings.ToLower(brokerURL), "nats") || strings.HasPrefix(strings.ToLower(brokerURL), "tls") {
		return src + ".dead"
	}
	return src + "-dead"
}

// NATS JetStream.

type natsSidecar struct {
	ready      sync.Map // subjects publish has ensured a stream for
	nc         *nats.Conn
	js         jetstream.JetStream
	prod       *idemnats.Producer
	url        string
	duplicates time.Duration
}

var streamNameRE = regexp.MustCompile(`[^A-Za-z0-9_-]`)

// ensureStream returns the stream that captures subject, creating one
// named after it (file storage) when none does.
func (b *natsSidecar) ensureStream(ctx context.Context, subject string) (jetstream.Stream, error) {
	name, err := b.js.StreamNameBySubject(ctx, subject)
	if err == nil {
		return b.js.Stream(ctx, name)
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("NATS: find the stream of %s: %w", subject, err)
	}
	s, err := b.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: "IDEM_" + strings.ToUpper(streamNameRE.ReplaceAllString(subject, "_")), Subjects: []string{subject},
		Storage: jetstream.FileStorage, Duplicates: b.duplicates,
	})
	if err != nil {
		return nil, fmt.Errorf("NATS: create a stream for %s: %w", subject, err)
	}
	return s, nil
}

func (b *natsSidecar) consume(ctx context.Context, src string, p idem.Processor, o consumeConfig) (run, stop func(context.Context) error, err error) {
	s, err := b.ensureStream(ctx, src)
	if err != nil {
		return nil, nil, err
	}
	if _, err := b.ensureStream(ctx, o.deadLetter); err != nil {
		return nil, nil, err
	}
	cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: o.group, FilterSubject: src, AckPolicy: jetstream.AckExplicitPolicy, AckWait: o.ackWait,
		MaxAckPending: max(1000, 4*o.concurrency),
	})
	if err != nil {
		return nil, nil, fmt.Errorf("NATS: create the durable consumer %s: %w", o.group, err)
	}
	cfg := idemnats.Config{Processor: p, DeadLetter: o.deadLetter,
		Concurrency: o.concurrency, RetryDelay: o.retryDelay, Logger: o.logger}
	if o.batch != nil {
		// The messages held go in batches, o.batchesAtOnce at a time
		// (see batchesAtOnce).
		cfg.Processor, cfg.BatchProcessor = nil, o.batch
		cfg.Concurrency, cfg.MaxMessages = max(1, min(o.batchesAtOnce, o.concurrency)), o.concurrency
	}
	c, err := idemnats.NewConsumer(b.js, cons, cfg)
	if err != nil {
		return nil, nil, err
	}
	return c.Run, c.Stop, nil
}

func (b *natsSidecar) publish(ctx context.Context, dst, id string, payload []byte) error {
	if _, ok := b.ready.Load(dst); !ok {
		if _, err := b.ensureStream(ctx, dst); err != nil {
			return err
		}
		b.ready.Store(dst, true)
	}
	_, err := b.prod.Publish(ctx, dst, payload, idemnats.WithMessageID(id))
	return err
}

func (b *natsSidecar) healthy(context.Context) bool { return b.nc.IsConnected() }
func (b *natsSidecar) where() string                { return "NATS at " + redact(b.url) }
func (b *natsSidecar) close()                       { b.nc.Close() }

// Kafka.

type kafkaSidecar struct {
	seeds []string
	cl    *kgo.Client
	prod  *idemkafka.Producer
}

func (b *kafkaSidecar) consume(_ context.Context, src string, p idem.Processor, o consumeConfig) (run, stop func(context.Context) error, err error) {
	opts := []kgo.Opt{
		kgo.SeedBrokers(b.seeds...),
		kgo.ConsumerGroup(o.group),
		kgo.ConsumeTopics(src),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.AllowAutoTopicCreation(),
		// Kafka refuses a session timeout under its
		// group.min.session.timeout.ms (6s by default).
		kgo.SessionTimeout(max(o.ackWait, minKafkaSessionTimeout)),
		kgo.FetchMaxWait(250 * time.Millisecond),
	}
	if o.kafkaInstanceID != "" {
		// A static member: a restart with the same name takes the old
		// member's partitions back at once, without a rebalance or
		// waiting out its session.
		opts = append(opts, kgo.InstanceID(o.kafkaInstanceID))
	}
	cl, err := kgo.NewClient(append(opts, idemkafka.ClientOpts()...)...)
	if err != nil {
		return nil, nil, err
	}
	order := idemkafka.OrderPartition
	if o.kafkaKeyOrder {
		order = idemkafka.OrderKey
	}
	cfg := idemkafka.Config{Processor: p, DeadLetter: o.deadLetter,
		Concurrency: o.concurrency, Order: order, RetryDelay: o.retryDelay, Logger: o.logger}
	if o.batch != nil {
		// The records of a partition are called one at a time, so
		// more partitions at once than calls would only wait; the
		// messages held are split among them.
		cfg.Processor, cfg.BatchProcessor = nil, o.batch
		cfg.Concurrency = o.calls
		cfg.BatchSize = max(1, o.concurrency/o.calls)
	}
	c, err := idemkafka.NewConsumer(cl, cfg)
	if err != nil {
		cl.Close()
		return nil, nil, err
	}
	stop = func(ctx context.Context) error {
		err := c.Stop(ctx)
		cl.Close()
		return err
	}
	return c.Run, stop, nil
}

func (b *kafkaSidecar) publish(ctx context.Context, dst, id string, payload []byte) error {
	_, err := b.prod.Publish(ctx, dst, payload, idemkafka.WithMessageID(id), idemkafka.WithKey([]byte(id)))
	return err
}

func (b *kafkaSidecar) healthy(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return b.cl.Ping(ctx) == nil
}
func (b *kafkaSidecar) where() string { return "Kafka at " + strings.Join(b.seeds, ",") }
func (b *kafkaSidecar) close()        { b.cl.Close() }

// RabbitMQ.

type amqpSidecar struct {
	ready sync.Map // queues publish has declared
	url   string
	conn  *amqp.Connection
	prod  *idemamqp.Producer
}

// declare declares the durable queues.
func (b *amqpSidecar) declare(queues ...string) error {
	ch, err := b.conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	for _, q := range queues {
		if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			return fmt.Errorf("RabbitMQ: declare %s: %w", q, err)
		}
	}
	return nil
}

func (b *amqpSidecar) consume(_ context.Context, src string, p idem.Processor, o consumeConfig) (run, stop func(context.Context) error, err error) {
	if err := b.declare(src, o.deadLetter); err != nil {
		return nil, nil, err
	}
	c, err := idemamqp.NewConsumer(b.conn, idemamqp.Config{Processor: p, Queue: src, DeadLetter: o.deadLetter,
		Concurrency: o.concurrency, Prefetch: 2 * o.concurrency, RetryDelay: o.retryDelay, Logger: o.logger,
		Redial: func(context.Context) (*amqp.Connection, error) { return dialAMQP(b.url) }})
	if err != nil {
		return nil, nil, err
	}
	return c.Run, c.Stop, nil
}

func (b *amqpSidecar) publish(ctx context.Context, dst, id string, payload []byte) error {
	if _, ok := b.ready.Load(dst); !ok {
		if err := b.declare(dst); err != nil {
			return err
		}
		b.ready.Store(dst, true)
	}
	_, err := b.prod.Publish(ctx, dst, payload, idemamqp.WithMessageID(id))
	return err
}

func (b *amqpSidecar) healthy(context.Context) bool { return !b.conn.IsClosed() }
func (b *amqpSidecar) where() string                { return "RabbitMQ at " + redact(b.url) }
func (b *amqpSidecar) close() {
	_ = b.prod.Close()
	_ = b.conn.Close()
}

// Redis Streams.

type redisSidecar struct {
	rdb  *redis.Client
	addr string
	prod *idemredisstream.Producer
}

func (b *redisSidecar) consume(_ context.Context, src string, p idem.Processor, o consumeConfig) (run, stop func(context.Context) error, err error) {
	host, _ := os.Hostname()
	cfg := idemredisstream.Config{
		Processor: p, Stream: src, Group: o.group, DeadLetter: o.deadLetter,
		Consumer:    fmt.Sprintf("%s-%d-%d", host, os.Getpid(), time.Now().UnixNano()),
		Concurrency: o.concurrency, MinIdle: o.ackWait, RetryDelay: o.retryDelay,
		Block: 250 * time.Millisecond, Logger: o.logger,
	}
	if o.batch != nil {
		// The messages held go in batches (one XREADGROUP or XAUTOCLAIM
		// each), o.batchesAtOnce at a time (see batchesAtOnce): while
		// one batch's answers are recorded the next one's are claimed
		// and called.
		cfg.Processor, cfg.BatchProcessor = nil, o.batch
		cfg.Concurrency = max(1, min(o.batchesAtOnce, o.concurrency))
		cfg.BatchSize = max(1, o.concurrency/cfg.Concurrency)
	}
	c, err := idemredisstream.NewConsumer(b.rdb, cfg)
	if err != nil {
		return nil, nil, err
	}
	return c.Run, c.Stop, nil
}

func (b *redisSidecar) publish(ctx context.Context, dst, id string, payload []byte) error {
	_, err := b.prod.Publish(ctx, dst, payload, idemredisstream.WithMessageID(id))
	return err
}

func (b *redisSidecar) healthy(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return b.rdb.Ping(ctx).Err() == nil
}
func (b *redisSidecar) where() string { return "Redis Streams at " + b.addr }
func (b *redisSidecar) close()        { b.rdb.Close() }

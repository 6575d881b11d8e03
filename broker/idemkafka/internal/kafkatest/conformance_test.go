package kafkatest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/broker/idemkafka"
)

// TestConformance runs the shared broker suite and the outbox case on a kfake cluster of three
// brokers, one cluster per case.
func TestConformance(t *testing.T) {
	t.Parallel()
	h := brokertest.Harness{New: func(t *testing.T) brokertest.Broker {
		return newTestBroker(t)
	}}
	brokertest.Run(t, h)
	brokertest.RunOutbox(t, h)
}

// TestConformanceKeyOrder runs the shared broker suite with
// idemkafka.OrderKey: every record keyed by its ID, so the records of a
// partition run concurrently, crashes, rebalances, retries and dead
// letters included. The batch case keeps partition order (OrderKey needs a
// Processor).
func TestConformanceKeyOrder(t *testing.T) {
	t.Parallel()
	brokertest.Run(t, brokertest.Harness{New: func(t *testing.T) brokertest.Broker {
		b := newTestBroker(t)
		b.order = idemkafka.OrderKey
		return b
	}})
}

// TestConformanceKafka011 runs the suite on a kfake cluster that answers
// as Kafka 0.11.0 (kfake.MaxVersions): the oldest release the package
// supports, the first with record headers, which carry the message ID.
// kgo negotiates each request's version with ApiVersions.
func TestConformanceKafka011(t *testing.T) {
	t.Parallel()
	brokertest.Run(t, brokertest.Harness{New: func(t *testing.T) brokertest.Broker {
		return newTestBrokerAt(t, kversion.V0_11_0())
	}})
}

// testBroker is one topic, its dead-letter topic and one consumer group on
// a fresh kfake cluster, seen through this package's Consumer and Producer.
type testBroker struct {
	t                *testing.T
	seeds            []string
	topic, dead, grp string
	raw              *kgo.Client
	prod             *idemkafka.Producer
	order            idemkafka.Order // of the Processor's members; batch members keep partition order
}

var (
	_ brokertest.BatchBroker    = (*testBroker)(nil)
	_ brokertest.PayloadLimiter = (*testBroker)(nil)
)

// PayloadLimit implements brokertest.PayloadLimiter: a kgo producer batch
// holds at most about 1 MB (kgo.ProducerBatchMaxBytes), and a dead letter
// adds its headers to the payload.
func (b *testBroker) PayloadLimit() int { return 900 << 10 }

func newTestBroker(t *testing.T) *testBroker { return newTestBrokerAt(t, nil) }

// newTestBrokerAt is newTestBroker on a cluster answering as the Kafka
// release whose protocol versions v lists.
func newTestBrokerAt(t *testing.T, v *kversion.Versions) *testBroker {
	b := &testBroker{t: t, topic: uniqueName("events"), dead: uniqueName("events-dead"), grp: uniqueName("group")}
	b.seeds = newClusterAt(t, v, b.topic, b.dead).ListenAddrs()
	b.raw = newClient(t, b.seeds)
	b.prod = idemkafka.NewProducer(b.raw, idemkafka.ProducerConfig{})
	return b
}

// Publish publishes through the Producer, keyed by the ID. An empty ID
// publishes without the header; an ID the Producer refuses (it validates
// IDs) is written raw, header included, as a foreign producer would.
func (b *testBroker) Publish(ctx context.Context, id string, payload []byte) error {
	if id == "" {
		return b.raw.ProduceSync(ctx, &kgo.Record{Topic: b.topic, Value: payload}).FirstErr()
	}
	_, err := b.prod.Publish(ctx, b.topic, payload, idemkafka.WithMessageID(id), idemkafka.WithKey([]byte(id)))
	if errors.Is(err, idem.ErrInvalidMessageID) {
		return b.raw.ProduceSync(ctx, &kgo.Record{Topic: b.topic, Key: []byte(id), Value: payload,
			Headers: []kgo.RecordHeader{{Key: idemkafka.DefaultIDHeader, Value: []byte(id)}}}).FirstErr()
	}
	return err
}

func (b *testBroker) Start(ctx context.Context, p idem.Processor, opts brokertest.StartOptions) (brokertest.Member, error) {
	return b.start(idemkafka.Config{Processor: p}, opts)
}

func (b *testBroker) StartBatch(ctx context.Context, p idem.BatchProcessor, opts brokertest.StartOptions) (brokertest.Member, error) {
	return b.start(idemkafka.Config{BatchProcessor: p, BatchSize: opts.BatchSize}, opts)
}

func (b *testBroker) config(cfg idemkafka.Config, opts brokertest.StartOptions) idemkafka.Config {
	cfg.DeadLetter = b.dead
	cfg.Concurrency = opts.Concurrency
	cfg.MaxPollRecords = opts.Prefetch
	cfg.HandlerTimeout = opts.HandlerTimeout
	cfg.RetryDelay = max(opts.Redelivery/4, 50*time.Millisecond)
	if cfg.Processor != nil {
		cfg.Order = b.order
	}
	return cfg
}

func (b *testBroker) start(cfg idemkafka.Config, opts brokertest.StartOptions) (brokertest.Member, error) {
	return startMember(b.t, b.seeds, b.grp, b.topic, b.config(cfg, opts)), nil
}

// NewConsumer implements brokertest.Broker: a Consumer on a group client of
// its own, which leaves the group when Run returns, as an application
// closes its client then.
func (b *testBroker) NewConsumer(p idem.Processor, opts brokertest.StartOptions) (brokertest.Runner, error) {
	cl, err := kgo.NewClient(groupOpts(b.seeds, b.grp, b.topic)...)
	if err != nil {
		return nil, err
	}
	b.t.Cleanup(cl.Close)
	c, err := idemkafka.NewConsumer(cl, b.config(idemkafka.Config{Processor: p}, opts))
	if err != nil {
		return nil, err
	}
	return closingRunner{c, cl}, nil
}

// closingRunner closes the client once Run has returned (unless it was a
// second Run, refused).
type closingRunner struct {
	*idemkafka.Consumer
	cl *kgo.Client
}

func (r closingRunner) Run(ctx context.Context) error {
	err := r.Consumer.Run(ctx)
	if !errors.Is(err, idem.ErrAlreadyRunning) {
		r.cl.Close()
	}
	return err
}

func (b *testBroker) DeadLetters(ctx context.Context) ([]brokertest.DeadLetter, error) {
	recs, err := deadLetters(ctx, b.seeds, b.dead)
	if err != nil {
		return nil, err
	}
	out := make([]brokertest.DeadLetter, 0, len(recs))
	for _, r := range recs {
		out = append(out, brokertest.DeadLetter{ID: header(r, idemkafka.DefaultIDHeader), Payload: r.Value,
			Reason: header(r, idem.HeaderDeadLetterReason), Error: header(r, idem.HeaderDeadLetterError)})
	}
	return out, nil
}

// Stop implements brokertest.Member: a graceful Stop, then the client
// leaves the group.
func (m *member) Stop(ctx context.Context) error { return m.stop(ctx) }

// Crash implements brokertest.Member: the member leaves the group without
// committing anything more, as a killed process would.
func (m *member) Crash() { m.crash() }

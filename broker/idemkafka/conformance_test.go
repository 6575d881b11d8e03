package idemkafka

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/brokertest"
)

// TestConformance runs the shared broker suite on a kfake cluster of three
// brokers, one cluster per case.
func TestConformance(t *testing.T) {
	t.Parallel()
	brokertest.Run(t, brokertest.Harness{New: func(t *testing.T) brokertest.Broker {
		return newTestBroker(t)
	}})
}

// testBroker is one topic, its dead-letter topic and one consumer group on
// a fresh kfake cluster, seen through this package's Consumer and Producer.
type testBroker struct {
	t                *testing.T
	seeds            []string
	topic, dead, grp string
	raw              *kgo.Client
	prod             *Producer
}

var _ brokertest.BatchBroker = (*testBroker)(nil)

func newTestBroker(t *testing.T) *testBroker {
	b := &testBroker{t: t, topic: uniqueName("events"), dead: uniqueName("events-dead"), grp: uniqueName("group")}
	b.seeds = newCluster(t, b.topic, b.dead).ListenAddrs()
	b.raw = newClient(t, b.seeds)
	b.prod = NewProducer(b.raw, ProducerConfig{})
	return b
}

// Publish publishes through the Producer, keyed by the ID. An empty ID
// publishes without the header; an ID the Producer refuses (it validates
// IDs) is written raw, header included, as a foreign producer would.
func (b *testBroker) Publish(ctx context.Context, id string, payload []byte) error {
	if id == "" {
		return b.raw.ProduceSync(ctx, &kgo.Record{Topic: b.topic, Value: payload}).FirstErr()
	}
	_, err := b.prod.Publish(ctx, b.topic, payload, WithMessageID(id), WithKey([]byte(id)))
	if errors.Is(err, idem.ErrInvalidMessageID) {
		return b.raw.ProduceSync(ctx, &kgo.Record{Topic: b.topic, Key: []byte(id), Value: payload,
			Headers: []kgo.RecordHeader{{Key: DefaultIDHeader, Value: []byte(id)}}}).FirstErr()
	}
	return err
}

func (b *testBroker) Start(ctx context.Context, p idem.Processor, opts brokertest.StartOptions) (brokertest.Member, error) {
	return b.start(Config{Processor: p}, opts)
}

func (b *testBroker) StartBatch(ctx context.Context, p idem.BatchProcessor, opts brokertest.StartOptions) (brokertest.Member, error) {
	return b.start(Config{BatchProcessor: p, BatchSize: opts.BatchSize}, opts)
}

func (b *testBroker) start(cfg Config, opts brokertest.StartOptions) (brokertest.Member, error) {
	cfg.DeadLetter = b.dead
	cfg.Concurrency = opts.Concurrency
	cfg.RetryDelay = max(opts.Redelivery/4, 50*time.Millisecond)
	return startMember(b.t, b.seeds, b.grp, b.topic, cfg), nil
}

func (b *testBroker) DeadLetters(ctx context.Context) ([]brokertest.DeadLetter, error) {
	recs, err := deadLetters(ctx, b.seeds, b.dead)
	if err != nil {
		return nil, err
	}
	out := make([]brokertest.DeadLetter, 0, len(recs))
	for _, r := range recs {
		out = append(out, brokertest.DeadLetter{ID: header(r, DefaultIDHeader), Payload: r.Value, Reason: header(r, HeaderDeadLetterReason)})
	}
	return out, nil
}

// Stop implements brokertest.Member: a graceful Stop, then the client
// leaves the group.
func (m *member) Stop(ctx context.Context) error { return m.stop(ctx) }

// Crash implements brokertest.Member: the member leaves the group without
// committing anything more, as a killed process would.
func (m *member) Crash() { m.crash() }

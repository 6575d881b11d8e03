package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemkafka"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// kafkaIDHeader is the record header that carries the message ID (the
// Kafka adapter's default).
const kafkaIDHeader = "message-id"

// kafkaPartitions is the number of partitions of each run's topic.
const kafkaPartitions = 4

// kafkaBroker is franz-go's in-process kfake cluster (one broker, in
// memory), reached over loopback TCP by kgo clients.
type kafkaBroker struct {
	fake *kfake.Cluster
	prod *kgo.Client
	adm  *kadm.Client
}

func newKafkaBroker(ctx context.Context) (*kafkaBroker, error) {
	fake, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		return nil, fmt.Errorf("kfake: %w", err)
	}
	b := &kafkaBroker{fake: fake}
	b.prod, err = kgo.NewClient(kgo.SeedBrokers(fake.ListenAddrs()...),
		kgo.ProducerLinger(0), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	if err == nil {
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = b.prod.Ping(pctx)
		cancel()
	}
	if err != nil {
		b.close()
		return nil, fmt.Errorf("kfake: %w", err)
	}
	b.adm = kadm.NewClient(b.prod)
	return b, nil
}

func (b *kafkaBroker) name() string { return "kafka" }

func (b *kafkaBroker) close() {
	if b.prod != nil {
		b.prod.Close()
	}
	b.fake.Close()
}

func (b *kafkaBroker) newChannel(ctx context.Context, tag string, _ time.Duration) (channel, error) {
	c := &kafkaChannel{b: b, topic: "bench-" + tag, group: "bench-" + tag}
	resp, err := b.adm.CreateTopic(ctx, kafkaPartitions, 1, nil, c.topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		return nil, fmt.Errorf("kafka: create topic: %w", err)
	}
	return c, nil
}

type kafkaChannel struct {
	b            *kafkaBroker
	topic, group string
	outTopic     string // the outgoing topic, once made
	published    atomic.Int64
}

func (c *kafkaChannel) publish(ctx context.Context, id string, payload []byte) (bool, error) {
	rec := &kgo.Record{Topic: c.topic, Key: []byte(id), Value: payload,
		Headers: []kgo.RecordHeader{{Key: kafkaIDHeader, Value: []byte(id)}}}
	if err := c.b.prod.ProduceSync(ctx, rec).FirstErr(); err != nil {
		return false, err
	}
	c.published.Add(1)
	return false, nil
}

func (c *kafkaChannel) retryInPlace() bool { return true }

// settled reports whether the group has committed every published record:
// the committed offsets of the topic's partitions add up to the number of
// records published (every record is published before the run consumes).
func (c *kafkaChannel) settled(ctx context.Context) (bool, error) {
	offs, err := c.b.adm.FetchOffsets(ctx, c.group)
	if err != nil {
		return false, err
	}
	if err := offs.Error(); err != nil {
		return false, err
	}
	var sum int64
	offs.Each(func(o kadm.OffsetResponse) {
		if o.Topic == c.topic && o.At > 0 {
			sum += o.At
		}
	})
	return sum == c.published.Load(), nil
}

func (c *kafkaChannel) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = c.b.adm.DeleteTopic(ctx, c.topic)
	if c.outTopic != "" {
		_, _ = c.b.adm.DeleteTopic(ctx, c.outTopic)
	}
}

func (c *kafkaChannel) outgoing(ctx context.Context) (string, idem.Publisher, func(context.Context) (int, error), error) {
	c.outTopic = "out-" + c.topic
	resp, err := c.b.adm.CreateTopic(ctx, kafkaPartitions, 1, nil, c.outTopic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		return "", nil, nil, fmt.Errorf("kafka: create outgoing topic: %w", err)
	}
	held := func(ctx context.Context) (int, error) {
		ends, err := c.b.adm.ListEndOffsets(ctx, c.outTopic)
		if err != nil {
			return 0, err
		}
		var n int64
		ends.Each(func(o kadm.ListedOffset) {
			if o.Err == nil {
				n += o.Offset
			}
		})
		return int(n), nil
	}
	return c.outTopic, idemkafka.NewPublisher(c.b.prod, idemkafka.ProducerConfig{IDHeader: kafkaIDHeader}), held, nil
}

// member joins the consumer group with a new client. Offsets are committed
// by commit, after every record of a poll was handled, and never otherwise:
// no autocommit, so a member that crashes leaves its records uncommitted and
// the next member replays them from the last commit.
func (c *kafkaChannel) member(ctx context.Context) (member, error) {
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(c.b.fake.ListenAddrs()...),
		kgo.ConsumerGroup(c.group),
		kgo.ConsumeTopics(c.topic),
		kgo.DisableAutoCommit(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(200*time.Millisecond),
	)
	if err != nil {
		return nil, err
	}
	return &kafkaMember{cl: cl}, nil
}

type kafkaMember struct {
	cl      *kgo.Client
	crashed atomic.Bool
}

func (m *kafkaMember) fetch(ctx context.Context, max int) ([]delivery, error) {
	if m.crashed.Load() {
		return nil, errCrashed
	}
	pctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	fs := m.cl.PollRecords(pctx, max)
	if fs.IsClientClosed() {
		return nil, errCrashed
	}
	var out []delivery
	fs.EachRecord(func(r *kgo.Record) {
		d := delivery{payload: r.Value, ack: func() error { return nil }, rec: r}
		for _, h := range r.Headers {
			if h.Key == kafkaIDHeader {
				d.id = string(h.Value)
			}
		}
		out = append(out, d)
	})
	return out, nil
}

// commit commits the offsets of one poll's records, every one of them
// handled, after the earlier polls' (the caller keeps that order).
func (m *kafkaMember) commit(ctx context.Context, ds []delivery) error {
	if m.crashed.Load() {
		return errCrashed
	}
	recs := make([]*kgo.Record, len(ds))
	for i, d := range ds {
		recs[i] = d.rec.(*kgo.Record)
	}
	return m.cl.CommitRecords(ctx, recs...)
}

func (m *kafkaMember) crash() {
	if m.crashed.Swap(true) {
		return
	}
	// Leave the group without committing (autocommit is off, so the
	// revoke commits nothing): the next member replays from the last
	// commit at once, instead of after the session timeout a killed
	// process would cost.
	m.cl.CloseAllowingRebalance()
}

func (m *kafkaMember) stop(ctx context.Context) {
	if m.crashed.Load() {
		return
	}
	m.cl.Close() // the pipeline has committed what was handled
}

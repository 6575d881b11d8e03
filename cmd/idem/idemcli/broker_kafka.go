package idemcli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The demo's Kafka names. The message ID travels in a record header.
const (
	kafkaTopic     = "idem-demo-payments"
	kafkaDeadTopic = "idem-demo-payments-dead"
	kafkaGroup     = "idem-demo-payments"
	kafkaIDHeader  = "message-id"
)

// kafkaBroker carries the demo's messages on Kafka: franz-go's in-process
// kfake cluster of three brokers ("kafka:embedded") or a real cluster
// ("kafka://host:port,host:port"). Each demo consumer is its own group
// member, so a consumer that dies triggers a rebalance and its partitions'
// uncommitted records are replayed to the others: the seed's rebalance story.
type kafkaBroker struct {
	fake  *kfake.Cluster
	seeds []string
	prod  *kgo.Client
	adm   *kadm.Client
}

func openKafka(ctx context.Context, url string) (*kafkaBroker, error) {
	b := &kafkaBroker{}
	if url == "kafka:embedded" || url == "kafka:" {
		var err error
		b.fake, err = kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(8, kafkaTopic, kafkaDeadTopic))
		if err != nil {
			return nil, fmt.Errorf("embedded Kafka: %w", err)
		}
		b.seeds = b.fake.ListenAddrs()
	} else {
		b.seeds = strings.Split(strings.TrimPrefix(strings.TrimPrefix(url, "kafka://"), "kafka:"), ",")
	}
	var err error
	b.prod, err = kgo.NewClient(kgo.SeedBrokers(b.seeds...), kgo.AllowAutoTopicCreation())
	if err == nil {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = b.prod.Ping(pctx)
		cancel()
	}
	if err != nil {
		b.close()
		return nil, fmt.Errorf("cannot reach Kafka at %s: %w", strings.Join(b.seeds, ","), err)
	}
	b.adm = kadm.NewClient(b.prod)
	return b, nil
}

func (b *kafkaBroker) publish(ctx context.Context, id string, payload []byte) (bool, error) {
	rec := &kgo.Record{Topic: kafkaTopic, Key: []byte(id), Value: payload,
		Headers: []kgo.RecordHeader{{Key: kafkaIDHeader, Value: []byte(id)}}}
	return false, b.prod.ProduceSync(ctx, rec).FirstErr()
}

func (b *kafkaBroker) deadLetter(ctx context.Context, d delivery, reason error) error {
	rec := &kgo.Record{Topic: kafkaDeadTopic, Value: d.payload(), Headers: []kgo.RecordHeader{
		{Key: kafkaIDHeader, Value: []byte(d.id())},
		{Key: "idem-dead-letter-reason", Value: []byte(reason.Error())},
	}}
	return b.prod.ProduceSync(ctx, rec).FirstErr()
}

// worker joins the consumer group as a new member. Offsets are committed
// only after the records' transactions committed, between polls (rebalances
// wait for that), and never by a member that dies.
func (b *kafkaBroker) worker(ctx context.Context) (demoWorker, error) {
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(b.seeds...),
		kgo.ConsumerGroup(kafkaGroup),
		kgo.ConsumeTopics(kafkaTopic),
		kgo.AutoCommitMarks(), // only records whose transaction committed are marked
		kgo.BlockRebalanceOnPoll(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	)
	if err != nil {
		return nil, err
	}
	return &kafkaWorker{cl: cl}, nil
}

// unfinished is the consumer group's lag: records not yet committed.
func (b *kafkaBroker) unfinished(ctx context.Context) (int, error) {
	lags, err := b.adm.Lag(ctx, kafkaGroup)
	if err != nil {
		return 0, err
	}
	if err := lags.Error(); err != nil {
		return 0, err
	}
	total := int64(0)
	lags.Each(func(l kadm.DescribedGroupLag) { total += l.Lag.Total() })
	return int(total), nil
}

func (b *kafkaBroker) close() {
	if b.prod != nil {
		b.prod.Close()
	}
	if b.fake != nil {
		b.fake.Close()
	}
}

type kafkaWorker struct{ cl *kgo.Client }

func (w *kafkaWorker) fetch(ctx context.Context, n int, maxWait time.Duration) ([]delivery, error) {
	pctx, cancel := context.WithTimeout(ctx, maxWait)
	defer cancel()
	fs := w.cl.PollRecords(pctx, n)
	var out []delivery
	fs.EachRecord(func(r *kgo.Record) { out = append(out, kafkaDelivery{w.cl, r}) })
	return out, nil
}

// batchDone commits the offsets of the records acked since the last poll,
// then lets a pending rebalance go ahead.
func (w *kafkaWorker) batchDone(ctx context.Context) {
	_ = w.cl.CommitMarkedOffsets(ctx)
	w.cl.AllowRebalance()
}

// crash leaves the group without committing: the records it processed but
// did not commit are replayed to another member after the rebalance.
func (w *kafkaWorker) crash() { w.cl.CloseAllowingRebalance() }

func (w *kafkaWorker) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = w.cl.CommitMarkedOffsets(ctx)
	w.cl.CloseAllowingRebalance()
}

type kafkaDelivery struct {
	cl *kgo.Client
	r  *kgo.Record
}

func (d kafkaDelivery) id() string {
	for _, h := range d.r.Headers {
		if h.Key == kafkaIDHeader {
			return string(h.Value)
		}
	}
	return ""
}
func (d kafkaDelivery) payload() []byte { return d.r.Value }

// ack marks the record; batchDone commits it.
func (d kafkaDelivery) ack() error { d.cl.MarkCommitRecords(d.r); return nil }

// Kafka has no per-record redelivery: a record that must be retried is
// retried in place, before any later offset of its partition is committed.
func (d kafkaDelivery) retryAfter(time.Duration) error { return errRetryInPlace }
func (d kafkaDelivery) settle() error                  { return d.ack() }

//go:build !nodemo

package demo

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemkafka"
	"github.com/idem-go/idem/cmd/idem/internal/connect"
	"github.com/idem-go/idem/cmd/idem/internal/secret"
)

// The demo's Kafka names. The message ID travels in idemkafka's record
// header, message-id.
const (
	kafkaTopic     = "idem-demo-payments"
	kafkaDeadTopic = "idem-demo-payments-dead"
	kafkaGroup     = "idem-demo-payments"
	// The receipts story: PaymentCharged events, sent by the outbox relay
	// (the ordering key is the record key).
	kafkaEventsTopic   = "idem-demo-payments-charged"
	kafkaReceiptsGroup = "idem-demo-receipts"
)

// kafkaBroker carries the demo's messages on Kafka through idemkafka:
// franz-go's in-process kfake cluster of three brokers ("kafka:embedded")
// or a real cluster ("kafka://host:port,host:port"). Each member is a
// consumer-group member with a client of its own, so a member that dies
// triggers a rebalance and its partitions' uncommitted records are replayed
// to the others: the seed's rebalance story.
type kafkaBroker struct {
	fake  *kfake.Cluster
	seeds []string
	cl    *kgo.Client
	adm   *kadm.Client
	prod  *idemkafka.Producer
}

func openKafka(ctx context.Context, url string) (_ *kafkaBroker, err error) {
	defer func() { err = secret.Error(err, url) }()
	if strings.Contains(url, "@") {
		// The demo speaks plain Kafka: no SASL to pass credentials to.
		return nil, fmt.Errorf("%w: broker %q: credentials in a kafka:// URL are not supported", connect.ErrBadURL, secret.URL(url))
	}
	b := &kafkaBroker{}
	if url == "kafka:embedded" || url == "kafka:" {
		if b.fake, err = kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(8, kafkaTopic, kafkaDeadTopic, kafkaEventsTopic)); err != nil {
			return nil, fmt.Errorf("embedded Kafka: %w", err)
		}
		b.seeds = b.fake.ListenAddrs()
	} else {
		b.seeds = strings.Split(strings.TrimPrefix(strings.TrimPrefix(url, "kafka://"), "kafka:"), ",")
	}
	if b.cl, err = connect.Kafka(ctx, b.seeds); err != nil {
		b.close()
		return nil, err
	}
	b.adm = kadm.NewClient(b.cl)
	b.prod = idemkafka.NewProducer(b.cl, idemkafka.ProducerConfig{})
	return b, nil
}

// publish keys the record by its ID, so that the copies of one payment go
// to one partition, in order.
func (b *kafkaBroker) publish(ctx context.Context, id string, payload []byte) (bool, error) {
	_, err := b.prod.Publish(ctx, kafkaTopic, payload, idemkafka.WithMessageID(id), idemkafka.WithKey([]byte(id)))
	return false, err
}

// member joins the consumer group with a new client. Its crash closes the
// client in the background: closing revokes the member's partitions, and
// the revocation waits for the handler that is crashing.
func (b *kafkaBroker) member(_ context.Context, p idem.Processor, log *slog.Logger) (*member, error) {
	return b.join(kafkaGroup, kafkaTopic, p, log)
}

// join runs p as a member of group consuming topic, with a new client.
func (b *kafkaBroker) join(group, topic string, p idem.Processor, log *slog.Logger) (*member, error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(b.seeds...),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.AllowAutoTopicCreation(), // the dead-letter topic, on a real cluster
		kgo.FetchMaxWait(250 * time.Millisecond),
	}, idemkafka.ClientOpts()...)...)
	if err != nil {
		return nil, err
	}
	c, err := idemkafka.NewConsumer(cl, idemkafka.Config{Processor: p, DeadLetter: kafkaDeadTopic,
		RetryDelay: demoRetryDelay, Logger: log})
	if err != nil {
		cl.Close()
		return nil, err
	}
	return &member{run: c.Run, shutdown: cl.CloseAllowingRebalance, background: true}, nil
}

// unfinished is the consumer group's lag: records not yet committed.
func (b *kafkaBroker) unfinished(ctx context.Context) (int, error) {
	return b.lag(ctx, kafkaGroup)
}

// lag is group's lag: records not yet committed.
func (b *kafkaBroker) lag(ctx context.Context, group string) (int, error) {
	lags, err := b.adm.Lag(ctx, group)
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

// deadLettered counts the records in the dead-letter topic.
func (b *kafkaBroker) deadLettered(ctx context.Context) (int64, error) {
	starts, err := b.adm.ListStartOffsets(ctx, kafkaDeadTopic)
	if err != nil {
		return 0, err
	}
	ends, err := b.adm.ListEndOffsets(ctx, kafkaDeadTopic)
	if err != nil {
		return 0, err
	}
	n := int64(0)
	ends.Each(func(o kadm.ListedOffset) {
		if s, ok := starts.Lookup(o.Topic, o.Partition); ok && o.Err == nil {
			n += o.Offset - s.Offset
		}
	})
	return n, nil
}

func (b *kafkaBroker) close() {
	if b.cl != nil {
		b.cl.Close()
	}
	if b.fake != nil {
		b.fake.Close()
	}
}

// eventsDestination is the topic of the PaymentCharged events.
func (b *kafkaBroker) eventsDestination() string { return kafkaEventsTopic }

// eventsPublisher is the relay's Kafka publisher, on the broker's client
// (the message-id header carries the outgoing ID).
func (b *kafkaBroker) eventsPublisher(context.Context) (idem.Publisher, error) {
	return idemkafka.NewPublisher(b.cl, idemkafka.ProducerConfig{}), nil
}

// receiptsMember joins the receipts consumer group.
func (b *kafkaBroker) receiptsMember(_ context.Context, p idem.Processor, log *slog.Logger) (*member, error) {
	return b.join(kafkaReceiptsGroup, kafkaEventsTopic, p, log)
}

func (b *kafkaBroker) eventsUnfinished(ctx context.Context) (int, error) {
	return b.lag(ctx, kafkaReceiptsGroup)
}

package console_test

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemkafka"
	"github.com/idem-go/idem/cmd/idem/internal/deadletter"
)

// Kafka's dead letters (franz-go's in-process kfake cluster: the test
// services have no Kafka) with a PostgreSQL store.
func TestKafkaDeadLettersReplayedOnce(t *testing.T) {
	store, _, _ := pgStore(t)
	src, dest := "console-pay", "console-pay-dead"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, src, dest))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	seeds := cluster.ListenAddrs()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	ctx := t.Context()
	prod := idemkafka.NewProducer(cl, idemkafka.ProducerConfig{})
	replayOnce(t, store, store, brokerCase{
		dls: deadletter.NewKafka(cl, "Kafka (kfake)", kgo.SeedBrokers(seeds...), kgo.FetchMaxWait(100*time.Millisecond)), dest: dest,
		consume: func(p idem.Processor) {
			gc, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(seeds...), kgo.ConsumerGroup("idem"), kgo.ConsumeTopics(src),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100 * time.Millisecond)}, idemkafka.ClientOpts()...)...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(gc.Close)
			c, err := idemkafka.NewConsumer(gc, idemkafka.Config{Processor: p, DeadLetter: dest})
			if err != nil {
				t.Fatal(err)
			}
			runUntilCleanup(t, c.Run)
		},
		publish: func(id string) {
			if _, err := prod.Publish(ctx, src, []byte("body-"+id), idemkafka.WithMessageID(id), idemkafka.WithKey([]byte(id))); err != nil {
				t.Fatal(err)
			}
		},
		inSource: func() int {
			ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, src)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			ends.Each(func(o kadm.ListedOffset) { n += int(o.Offset) })
			return n
		},
	})
}

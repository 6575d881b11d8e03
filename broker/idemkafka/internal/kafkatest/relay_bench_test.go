package kafkatest

import (
	"strconv"
	"testing"

	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/broker/idemkafka"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// BenchmarkRelay measures the outbox relay sending through NewPublisher
// to an in-process kfake cluster (one broker, the test topics' partition
// count), from a memory store (brokertest.RelayBench): batches of 100,
// with 1 and 4 rounds in flight. Run:
//
//	cat /proc/loadavg; go test -run '^$' -bench BenchmarkRelay -benchtime 100000x -count 5
func BenchmarkRelay(b *testing.B) {
	for _, workers := range []int{1, 4} {
		b.Run("workers"+strconv.Itoa(workers), func(b *testing.B) {
			const topic = "relay-bench"
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(testPartitions, topic))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(c.Close)
			cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(cl.Close)
			brokertest.RelayBench(b, idemkafka.NewPublisher(cl, idemkafka.ProducerConfig{}), topic, 100, workers)
		})
	}
}

package kafkatest

import (
	"context"
	"fmt"
	"log"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemkafka"
)

// A payments consumer on an in-process Kafka cluster (kfake, three
// brokers). The producer sends payment pay-1 twice (a retry after a lost
// acknowledgement): the handler charges once, and the copy is a Duplicate
// whose offset is committed like any other.
func Example() {
	ctx := context.Background()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(1, "payments", "payments-dead"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	prod, _ := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	defer prod.Close()
	producer := idemkafka.NewProducer(prod, idemkafka.ProducerConfig{})
	for _, id := range []string{"pay-1", "pay-2", "pay-1"} {
		if _, err := producer.Publish(ctx, "payments", []byte(`{"cents":1250}`), idemkafka.WithMessageID(id)); err != nil {
			log.Fatal(err)
		}
	}

	// The consumer: a group client with idemkafka.ClientOpts, an
	// Idempotent Consumer (here in memory; idemsql or idempgxv5 in
	// production), and the handler bound to it.
	seen := make(chan idem.Status, 3)
	payments, _ := idem.NewConsumer(idem.NewMemoryStore(nil), idem.Config{Name: "payments"})
	defer payments.Close()
	charge := idem.Bind(payments, func(ctx context.Context, tx *idem.MemoryTx, msg idem.Message) error {
		tx.OnCommit(func() { fmt.Println("charged", msg.ID) })
		return nil
	})
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cluster.ListenAddrs()...),
		kgo.ConsumerGroup("payments"), kgo.ConsumeTopics("payments")}, idemkafka.ClientOpts()...)...)
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()
	c, err := idemkafka.NewConsumer(cl, idemkafka.Config{DeadLetter: "payments-dead",
		Processor: idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
			out, err := charge.Process(ctx, msg)
			seen <- out.Status
			return out, err
		})})
	if err != nil {
		log.Fatal(err)
	}
	go c.Run(ctx)
	fmt.Println(<-seen, <-seen, <-seen)
	if err := c.Stop(ctx); err != nil { // commits the three offsets
		log.Fatal(err)
	}

	// Output:
	// charged pay-1
	// charged pay-2
	// Processed Processed Duplicate
}

package idemkafka_test

import (
	"context"
	"fmt"
	"log"
	"os/signal"
	"syscall"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemkafka"
)

// A payments consumer on the Kafka cluster at localhost:9092, with the
// topics payments and payments-dead. A producer that sends payment pay-1
// twice (a retry after a lost acknowledgement) charges once: the copy is
// a Duplicate whose offset is committed like any other. The handler's
// store is idem's MemoryStore here; in production it is store/idemsql or
// store/idempgxv5, and the effect is written in the claim's transaction.
//
// The example needs a running broker, so it is compiled but not run; the
// module's tests run the same flow on franz-go's in-process kfake cluster.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	seeds := kgo.SeedBrokers("localhost:9092")

	prod, err := kgo.NewClient(seeds)
	if err != nil {
		log.Fatal(err)
	}
	defer prod.Close()
	producer := idemkafka.NewProducer(prod, idemkafka.ProducerConfig{})
	for _, id := range []string{"pay-1", "pay-2", "pay-1"} {
		if _, err := producer.Publish(ctx, "payments", []byte(`{"cents":1250}`), idemkafka.WithMessageID(id)); err != nil {
			log.Fatal(err)
		}
	}

	// The consumer: a group client with idemkafka.ClientOpts, an
	// Idempotent Consumer, and the handler bound to it.
	payments, err := idem.NewConsumer(idem.NewMemoryStore(nil), idem.Config{Name: "payments"})
	if err != nil {
		log.Fatal(err)
	}
	defer payments.Close()
	charge := idem.Bind(payments, func(ctx context.Context, tx *idem.MemoryTx, msg idem.Message) error {
		tx.OnCommit(func() { fmt.Println("charged", msg.ID) })
		return nil
	})
	cl, err := kgo.NewClient(append([]kgo.Opt{seeds, kgo.ConsumerGroup("payments"), kgo.ConsumeTopics("payments")},
		idemkafka.ClientOpts()...)...)
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()
	c, err := idemkafka.NewConsumer(cl, idemkafka.Config{Processor: charge, DeadLetter: "payments-dead"})
	if err != nil {
		log.Fatal(err)
	}
	// Until SIGINT or SIGTERM; the offsets of what finished are committed.
	if err := c.Run(ctx); err != nil && ctx.Err() == nil {
		log.Fatal(err)
	}
}

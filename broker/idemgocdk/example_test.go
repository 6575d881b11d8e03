package idemgocdk_test

import (
	"context"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemgocdk"
	"gocloud.dev/pubsub"
	"gocloud.dev/pubsub/mempubsub"
)

// A payments consumer on an in-memory Go CDK topic (mempubsub): the
// producer's retry sends pay-1 twice, and the charge runs once. The same
// code runs on Google Cloud Pub/Sub, SQS or any other Go CDK driver: only
// how the topic and subscription are opened changes. The store is idem's
// MemoryStore (use store/idemsql or store/idempgxv5 in production).
func Example() {
	ctx := context.Background()
	topic := mempubsub.NewTopic()
	defer topic.Shutdown(ctx)
	sub := mempubsub.NewSubscription(topic, time.Minute)
	defer sub.Shutdown(ctx)
	dead := mempubsub.NewTopic()
	defer dead.Shutdown(ctx)

	// The consumer.
	payments, _ := idem.NewConsumer(idem.NewMemoryStore(nil), idem.Config{Name: "payments"})
	defer payments.Close()
	charge := idem.Bind(payments, func(ctx context.Context, tx *idem.MemoryTx, msg idem.Message) error {
		tx.OnCommit(func() { fmt.Println("charged", msg.ID, string(msg.Payload)) })
		return nil
	})
	// Outcomes are reported here only to end the example once all three
	// messages were settled.
	settled := make(chan idem.Status, 3)
	consumer, err := idemgocdk.NewConsumer(sub, idemgocdk.Config{
		DeadLetter: dead,
		Processor: idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
			out, err := charge.Process(ctx, msg)
			settled <- out.Status
			return out, err
		}),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	go consumer.Run(ctx)
	defer consumer.Stop(ctx)

	// The producer, retrying a send with the same business key.
	producer := idemgocdk.NewProducer(idemgocdk.ProducerConfig{})
	for _, id := range []string{"pay-1", "pay-1", "pay-2"} {
		if _, err := producer.Send(ctx, topic, &pubsub.Message{Body: []byte(`{"amount":100}`)}, id); err != nil {
			fmt.Println(err)
			return
		}
	}
	counts := map[idem.Status]int{}
	for range 3 {
		counts[<-settled]++
	}
	fmt.Println("processed:", counts[idem.Processed], "duplicates:", counts[idem.Duplicate])
	// Unordered output:
	// charged pay-1 {"amount":100}
	// charged pay-2 {"amount":100}
	// processed: 2 duplicates: 1
}

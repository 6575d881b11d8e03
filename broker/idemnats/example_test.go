package idemnats_test

import (
	"context"
	"fmt"
	"log"
	"os/signal"
	"syscall"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemnats"
)

// A consumer of a JetStream stream whose handler runs once per message
// ID, however often the message is published or delivered: a producer
// that retries order-1001 three times bills it once. The server is the one
// at nats.DefaultURL (nats://127.0.0.1:4222, started with JetStream on:
// nats-server -js). The store is idem's MemoryStore here; in production it
// is a SQL store (store/idemsql, store/idempgxv5) and the effect is written
// in the claim's transaction.
//
// The example needs a running server, so it is compiled but not run; the
// module's tests run the same flow on an in-process nats-server.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	stream, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.created", "orders.dead"}})
	if err != nil {
		log.Fatal(err)
	}
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "billing", FilterSubject: "orders.created"})
	if err != nil {
		log.Fatal(err)
	}

	consumer, err := idem.NewConsumer(idem.NewMemoryStore(nil), idem.Config{Name: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	defer consumer.Close()
	c, err := idemnats.NewConsumer(js, cons, idemnats.Config{
		Processor: idem.Bind(consumer, func(ctx context.Context, tx *idem.MemoryTx, msg idem.Message) error {
			fmt.Printf("invoice for %s: %s\n", msg.ID, msg.Payload)
			return nil
		}),
		DeadLetter: "orders.dead",
	})
	if err != nil {
		log.Fatal(err)
	}

	p := idemnats.NewProducer(js)
	for range 3 { // a producer retrying: JetStream and idem drop the repeats
		if _, err := p.Publish(ctx, "orders.created", []byte(`{"total":42}`), idemnats.WithMessageID("order-1001")); err != nil {
			log.Fatal(err)
		}
	}
	// Until SIGINT or SIGTERM.
	if err := c.Run(ctx); err != nil && ctx.Err() == nil {
		log.Fatal(err)
	}
}

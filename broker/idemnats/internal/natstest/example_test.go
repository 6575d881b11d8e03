package natstest

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemnats"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A consumer of a JetStream stream whose handler runs once per message
// ID, however often the message is published or delivered. The store here
// is idem's MemoryStore; in production it is a SQL store (store/idemsql,
// store/idempgxv5) and the effect is written in the claim's transaction.
func Example() {
	ctx := context.Background()
	nc, stop := startNATS() // an in-process JetStream server, for the example
	defer stop()
	js, _ := jetstream.New(nc)
	stream, _ := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.created", "orders.dead"}})
	cons, _ := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "billing", FilterSubject: "orders.created"})

	consumer, _ := idem.NewConsumer(idem.NewMemoryStore(nil), idem.Config{Name: "billing"})
	defer consumer.Close()
	done := make(chan struct{})
	c, _ := idemnats.NewConsumer(js, cons, idemnats.Config{
		Processor: idem.Bind(consumer, func(ctx context.Context, tx *idem.MemoryTx, msg idem.Message) error {
			fmt.Printf("invoice for %s: %s\n", msg.ID, msg.Payload)
			close(done)
			return nil
		}),
		DeadLetter: "orders.dead",
	})
	go c.Run(ctx)

	p := idemnats.NewProducer(js)
	for range 3 { // a producer retrying: JetStream and idem drop the repeats
		p.Publish(ctx, "orders.created", []byte(`{"total":42}`), idemnats.WithMessageID("order-1001"))
	}
	<-done
	c.Stop(ctx)
	// Output: invoice for order-1001: {"total":42}
}

// startNATS starts an in-process JetStream server and connects to it.
func startNATS() (*nats.Conn, func()) {
	dir, err := os.MkdirTemp("", "idemnats-example-")
	if err != nil {
		panic(err)
	}
	srv, err := server.NewServer(&server.Options{JetStream: true, StoreDir: dir, DontListen: true, NoSigs: true, NoLog: true})
	if err != nil {
		panic(err)
	}
	srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		panic("nats-server not ready")
	}
	nc, err := nats.Connect("", nats.InProcessServer(srv))
	if err != nil {
		panic(err)
	}
	return nc, func() { nc.Close(); srv.Shutdown(); srv.WaitForShutdown(); os.RemoveAll(dir) }
}

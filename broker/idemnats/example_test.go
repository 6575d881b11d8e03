package idemnats_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemnats"
)

// A consumer of a JetStream stream whose handler runs once per message
// ID, however often the message is published or delivered: a producer
// that retries order-1001 three times bills it once. The example runs
// against the JetStream-enabled NATS server named by IDEM_TEST_NATS_URL,
// on a stream of its own that it deletes at the end. The store is idem's
// MemoryStore; in production it is a SQL store (store/idemsql,
// store/idempgxv5) and the effect is written in the claim's transaction.
//
// It needs a server, so go test compiles it without running it (examples
// have no way to skip); TestExamplesOnServers runs it against the server
// and checks what it prints.
func Example() {
	ctx := context.Background()
	nc, err := nats.Connect(os.Getenv("IDEM_TEST_NATS_URL"))
	if err != nil {
		fmt.Println("this example needs NATS at IDEM_TEST_NATS_URL:", err)
		return
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	name := "ORDERS_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	created, dead := name+".created", name+".dead"
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{created, dead}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer js.DeleteStream(ctx, name)
	cons, _ := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "billing", FilterSubject: created})

	billing, _ := idem.NewConsumer(idem.NewMemoryStore(nil), idem.Config{Name: "billing"})
	defer billing.Close()
	billed := make(chan string, 3)
	c, err := idemnats.NewConsumer(js, cons, idemnats.Config{
		Processor: idem.Bind(billing, func(ctx context.Context, tx *idem.MemoryTx, msg idem.Message) error {
			tx.OnCommit(func() {
				fmt.Printf("invoice for %s: %s\n", msg.ID, msg.Payload)
				billed <- msg.ID
			})
			return nil
		}),
		DeadLetter: dead,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	go c.Run(ctx)
	defer c.Stop(ctx)

	p := idemnats.NewProducer(js)
	for range 3 { // a producer retrying: JetStream and idem drop the repeats
		if _, err := p.Publish(ctx, created, []byte(`{"total":42}`), idemnats.WithMessageID("order-1001")); err != nil {
			fmt.Println(err)
			return
		}
	}
	<-billed
}

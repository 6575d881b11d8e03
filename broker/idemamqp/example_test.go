package idemamqp_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemamqp"
	amqp "github.com/rabbitmq/amqp091-go"
)

// A payments consumer on RabbitMQ: the producer's retry publishes pay-1
// twice, and the charge runs once. The example runs against the RabbitMQ
// named by IDEM_TEST_AMQP_URL, on queues of its own that it deletes at the
// end; the store is idem's MemoryStore (use store/idemsql or
// store/idempgxv5 in production).
//
// It needs RabbitMQ, so go test compiles it without running it (examples
// have no way to skip); TestExamplesOnServers runs it against the server
// and checks what it prints.
func Example() {
	ctx := context.Background()
	conn, err := amqp.Dial(os.Getenv("IDEM_TEST_AMQP_URL"))
	if err != nil {
		fmt.Println("this example needs RabbitMQ at IDEM_TEST_AMQP_URL:", err)
		return
	}
	defer conn.Close()
	queue := "idem-example-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	setup, _ := conn.Channel()
	setup.QueueDeclare(queue, true, false, false, false, nil)
	setup.QueueDeclare(queue+".dead", true, false, false, false, nil)
	defer setup.QueueDelete(queue+".dead", false, false, false)
	defer setup.QueueDelete(queue, false, false, false)

	// The consumer.
	payments, _ := idem.NewConsumer(idem.NewMemoryStore(nil), idem.Config{Name: "payments"})
	defer payments.Close()
	charged := make(chan string, 10)
	consumer, err := idemamqp.NewConsumer(conn, idemamqp.Config{
		Queue:      queue,
		DeadLetter: queue + ".dead",
		Processor: idem.Bind(payments, func(ctx context.Context, tx *idem.MemoryTx, msg idem.Message) error {
			tx.OnCommit(func() { charged <- msg.ID + " " + string(msg.Payload) })
			return nil
		}),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	go consumer.Run(ctx)
	defer consumer.Stop(ctx)

	// The producer, retrying a publish with the same business key.
	producer := idemamqp.NewProducer(conn, idemamqp.ProducerConfig{})
	defer producer.Close()
	for _, id := range []string{"pay-1", "pay-1", "pay-2"} {
		if _, err := producer.Publish(ctx, queue, []byte(`{"amount":100}`), idemamqp.WithMessageID(id)); err != nil {
			fmt.Println(err)
			return
		}
	}
	fmt.Println(<-charged)
	fmt.Println(<-charged)
}

package idemredisstream_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemredisstream"
	"github.com/redis/go-redis/v9"
)

// A payments consumer on a Redis stream: the producer's retry appends pay-1
// twice, and the charge runs once. The example runs against the Redis
// named by IDEM_TEST_REDIS_URL, on streams of its own that it deletes at
// the end; the store is idem's MemoryStore (use store/idemsql or
// store/idempgxv5 in production).
//
// It needs Redis, so go test compiles it without running it (examples
// have no way to skip); TestExamplesOnServers runs it against the server
// and checks what it prints.
func Example() {
	ctx := context.Background()
	opts, err := redis.ParseURL(os.Getenv("IDEM_TEST_REDIS_URL"))
	if err != nil {
		fmt.Println("this example needs Redis at IDEM_TEST_REDIS_URL:", err)
		return
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	stream := "idem-example:{" + strconv.FormatInt(time.Now().UnixNano(), 36) + "}"
	defer rdb.Del(ctx, stream, stream+":dead")

	// The consumer.
	payments, _ := idem.NewConsumer(idem.NewMemoryStore(nil), idem.Config{Name: "payments"})
	defer payments.Close()
	charged := make(chan string, 10)
	consumer, err := idemredisstream.NewConsumer(rdb, idemredisstream.Config{
		Stream:     stream,
		Group:      "payments",
		Consumer:   "worker-1",
		DeadLetter: stream + ":dead",
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
	producer := idemredisstream.NewProducer(rdb, idemredisstream.ProducerConfig{})
	for _, id := range []string{"pay-1", "pay-1", "pay-2"} {
		if _, err := producer.Publish(ctx, stream, []byte(`{"amount":100}`), idemredisstream.WithMessageID(id)); err != nil {
			fmt.Println(err)
			return
		}
	}
	fmt.Println(<-charged)
	fmt.Println(<-charged)
}

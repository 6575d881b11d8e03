package idemwatermill_test

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemwatermill"
)

// Messages no redelivery can help (here one without the Payment-Id
// metadata key that holds the ID) go to a poison topic, with idem's reason
// in their metadata, and are acknowledged there. Watermill's poison queue
// is added before (outside) the idem middleware, and ShouldDeadLetter
// tells it which errors are such messages; any other error (a failed
// handler) is nacked for a redelivery.
func ExampleShouldDeadLetter() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pubSub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	defer pubSub.Close()
	poisoned, err := pubSub.Subscribe(ctx, "payments.poison")
	if err != nil {
		fmt.Println(err)
		return
	}

	payments, _ := idem.NewConsumer(idem.NewMemoryStore(nil), idem.Config{Name: "payments"})
	defer payments.Close()
	idempotent, err := idemwatermill.Transactional(payments, idemwatermill.Config{IDKey: "Payment-Id"})
	if err != nil {
		fmt.Println(err)
		return
	}
	poisonQueue, err := middleware.PoisonQueueWithFilter(pubSub, "payments.poison", idemwatermill.ShouldDeadLetter)
	if err != nil {
		fmt.Println(err)
		return
	}

	router, _ := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	charged := make(chan string, 1)
	router.AddNoPublisherHandler("charge", "payments", pubSub, func(msg *message.Message) error {
		tx, _ := idemwatermill.Tx[*idem.MemoryTx](msg.Context())
		tx.OnCommit(func() { charged <- msg.Metadata.Get("Payment-Id") })
		return nil
	}).AddMiddleware(poisonQueue, idempotent) // the poison queue first: it sees the idem middleware's error
	go router.Run(ctx)
	<-router.Running()

	withoutID := message.NewMessage(watermill.NewUUID(), []byte(`{"amount":100}`))
	withID := message.NewMessage(watermill.NewUUID(), []byte(`{"amount":100}`))
	withID.Metadata.Set("Payment-Id", "pay-1")
	for _, m := range []*message.Message{withoutID, withID} {
		if err := pubSub.Publish("payments", m); err != nil {
			fmt.Println(err)
			return
		}
	}
	p := <-poisoned
	p.Ack()
	fmt.Println("poisoned:", p.UUID == withoutID.UUID, p.Metadata.Get(idem.HeaderDeadLetterReason))
	fmt.Println("charged:", <-charged)
	_ = router.Close()
	// Output:
	// poisoned: true missing-message-id
	// charged: pay-1
}

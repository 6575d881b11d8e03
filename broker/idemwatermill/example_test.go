package idemwatermill_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemwatermill"
)

// A Watermill router charging payments from an in-process Pub/Sub
// (gochannel): the producer publishes pay-1 twice (a retried publish keeps
// the message's UUID) and the charge runs once. The store is idem's
// MemoryStore, whose transaction takes the effect through OnCommit; with
// store/idemsql the handler writes its rows with the *sql.Tx that Tx
// returns, and any Watermill Pub/Sub takes gochannel's place.
func Example() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pubSub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	defer pubSub.Close()

	payments, _ := idem.NewConsumer(idem.NewMemoryStore(nil), idem.Config{Name: "payments"})
	defer payments.Close()
	idempotent, err := idemwatermill.Transactional(payments, idemwatermill.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}

	router, _ := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	handled := make(chan struct{}, 3)
	handler := router.AddHandler("charge", "payments", pubSub, "receipts", pubSub, func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := idemwatermill.Tx[*idem.MemoryTx](msg.Context())
		tx.OnCommit(func() { fmt.Println("charged", msg.UUID, string(msg.Payload)) })
		return nil, nil // or receipts, published once the charge has committed
	})
	// Reports each message once the middleware is done with it, only to
	// end the example.
	handler.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			defer func() { handled <- struct{}{} }()
			return h(msg)
		}
	}, idempotent)
	go router.Run(ctx)
	<-router.Running()

	for _, id := range []string{"pay-1", "pay-1", "pay-2"} {
		if err := pubSub.Publish("payments", message.NewMessage(id, []byte(`{"amount":100}`))); err != nil {
			fmt.Println(err)
			return
		}
	}
	for range 3 {
		<-handled
	}
	_ = router.Close()
	// Unordered output:
	// charged pay-1 {"amount":100}
	// charged pay-2 {"amount":100}
}

// Lease mode, for effects outside the store (here an email): the welcome
// mail for user-1, delivered twice, is sent once, under an idempotency key
// for the mail provider. The message the handler returns is stored with
// the record and published again for the duplicate, with the same UUID, so
// that a crash before the first publish could not lose it.
func ExampleLease() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pubSub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	defer pubSub.Close()

	emails, _ := idem.NewLeaseConsumer(idem.NewMemoryStore(nil), idem.Config{Name: "emails", Lease: time.Minute, PurgeInterval: -1})
	defer emails.Close()
	idempotent, err := idemwatermill.Lease(emails, idemwatermill.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}

	router, _ := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	router.AddHandler("welcome", "users.created", pubSub, "mails.sent", pubSub, func(msg *message.Message) ([]*message.Message, error) {
		a := idemwatermill.Attempt(msg.Context())
		// The provider call would carry a.Key("welcome-mail") as its
		// idempotency key.
		fmt.Println("mail sent to", msg.UUID, "key set:", a.Key("welcome-mail") != "")
		return []*message.Message{message.NewMessage("mail-"+msg.UUID, []byte("welcome"))}, nil
	}).AddMiddleware(idempotent)
	sent := make(chan string, 2)
	router.AddHandler("audit", "mails.sent", pubSub, "audit.out", pubSub, func(msg *message.Message) ([]*message.Message, error) {
		sent <- msg.UUID
		return nil, nil
	})
	go router.Run(ctx)
	<-router.Running()

	// The redelivery comes after the first delivery's receipt: a copy
	// arriving while the first holds the lease would be InProgress, and
	// held for what is left of the lease (a minute here) before its retry.
	for range 2 {
		if err := pubSub.Publish("users.created", message.NewMessage("user-1", []byte(`{"name":"Ada"}`))); err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println("published:", <-sent)
	}
	_ = router.Close()
	// Output:
	// mail sent to user-1 key set: true
	// published: mail-user-1
	// published: mail-user-1
}

package idem_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/idem-go/idem"
)

// A message and its redelivery: the handler runs once, and the redelivery
// is a Duplicate to acknowledge. A handler writes its side effects in the
// transaction it receives (here the memory store's, with OnCommit; with
// PostgreSQL a pgx.Tx), so they commit together with the message's record.
func ExampleConsumer_Process() {
	ctx := context.Background()
	store := idem.NewMemoryStore(nil)
	c, err := idem.NewConsumer(store, idem.Config{Name: "billing"})
	if err != nil {
		panic(err)
	}
	defer c.Close()

	charge := func(ctx context.Context, tx *idem.MemoryTx, msg idem.Message) error {
		tx.OnCommit(func() { fmt.Printf("charged: %s\n", msg.Payload) })
		return nil
	}
	msg := idem.Message{ID: "order-42", Payload: []byte(`{"amount":200}`)}

	out, err := c.Process(ctx, msg, charge)
	fmt.Println(out.Status, out.Ack(), err)

	// The broker redelivers it (a lost ack, a rebalance...).
	out, err = c.Process(ctx, msg, charge)
	fmt.Println(out.Status, out.Ack(), err)

	// The producer reuses the ID for another payload: a bug to dead-letter.
	out, err = c.Process(ctx, idem.Message{ID: "order-42", Payload: []byte(`{"amount":500}`)}, charge)
	fmt.Println(out.Status, out.DeadLetter(), errors.Is(err, idem.ErrFingerprintMismatch))

	// Output:
	// charged: {"amount":200}
	// Processed true <nil>
	// Duplicate true <nil>
	// FingerprintMismatch true true
}

// A batch claims all its messages with one statement and runs the handler
// once with the new ones; every message gets its own outcome.
func ExampleConsumer_ProcessBatch() {
	ctx := context.Background()
	store := idem.NewMemoryStore(nil)
	c, err := idem.NewConsumer(store, idem.Config{Name: "shipping"})
	if err != nil {
		panic(err)
	}
	defer c.Close()

	ship := func(ctx context.Context, tx *idem.MemoryTx, msgs []idem.Message) error {
		for _, m := range msgs {
			fmt.Println("shipping", m.ID)
		}
		return nil
	}
	if _, err := c.ProcessBatch(ctx, []idem.Message{{ID: "order-1"}}, ship); err != nil {
		panic(err)
	}

	outs, err := c.ProcessBatch(ctx, []idem.Message{
		{ID: "order-1"}, // processed by the first batch
		{ID: "order-2"},
		{ID: ""}, // no ID: rejected, the rest of the batch goes on
		{ID: "order-3"},
		{ID: "order-2"}, // twice in one batch
	}, ship)
	for _, o := range outs {
		fmt.Printf("%q: %v\n", o.MessageID, o.Status)
	}
	fmt.Println(errors.Is(err, idem.ErrMissingMessageID))

	// Output:
	// shipping order-1
	// shipping order-2
	// shipping order-3
	// "order-1": Duplicate
	// "order-2": Processed
	// "": Rejected
	// "order-3": Processed
	// "order-2": Duplicate
	// true
}

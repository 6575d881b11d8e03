package idemotel_test

import (
	"context"
	"fmt"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemotel"
)

// A consumer with the Observer as its hook. Without options the Observer
// records on the global providers (otel.GetMeterProvider and
// otel.GetTracerProvider when NewObserver is called): set your SDK's
// providers there first, or pass them with WithMeterProvider and
// WithTracerProvider. Here one delivery and two redeliveries of pay-1 add
// to the counter idem.messages 1 with idem.consumer=payments and
// idem.status=processed, and 2 with idem.status=duplicate and
// idem.duplicate.reason=completed.
func Example() {
	obs, err := idemotel.NewObserver(idemotel.WithMessagingSystem("kafka"))
	if err != nil {
		panic(err)
	}
	c, err := idem.NewConsumer[*idem.MemoryTx](idem.NewMemoryStore(nil), idem.Config{
		Name: "payments", PurgeInterval: -1, Hooks: []idem.Hook{obs},
	})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	charge := func(context.Context, *idem.MemoryTx, idem.Message) error { return nil }
	msg := idem.Message{ID: "pay-1", Payload: []byte(`{"cents":100}`)}
	for range 3 { // one delivery and two redeliveries
		out, err := c.Process(context.Background(), msg, charge)
		if err != nil {
			panic(err)
		}
		fmt.Println(out.Status)
	}
	// Output:
	// Processed
	// Duplicate
	// Duplicate
}

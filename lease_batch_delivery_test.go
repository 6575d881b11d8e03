package idem_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// deliverySeen records, by message ID, the trace header of the Delivery
// that OnProcessStart finds in its context.
type deliverySeen struct {
	mu   sync.Mutex
	seen map[string]string
}

func (d *deliverySeen) OnProcessStart(ctx context.Context, e idem.ProcessStartEvent) context.Context {
	dl, _ := idem.DeliveryFromContext(ctx)
	v := "<no header>"
	if dl.Header != nil {
		v = dl.Header.Get("traceparent")
	}
	d.mu.Lock()
	d.seen[e.MessageID] = v
	d.mu.Unlock()
	return ctx
}

// TestLeaseBatchEachDeliveryItsHeaders: AcquireBatch under an adapter's
// Delivery of the whole batch (BatchHeaders, no Header) starts each
// message as a delivery of its own: the hooks' start (which a tracing
// hook continues the producer's trace from) and the attempt's Context
// see that message's headers, not the batch's nor another message's.
func TestLeaseBatchEachDeliveryItsHeaders(t *testing.T) {
	seen := &deliverySeen{seen: map[string]string{}}
	c, err := idem.NewLeaseConsumer(idem.NewMemoryStore(nil), idem.Config{Name: "c", Lease: time.Minute, PurgeInterval: -1,
		Hooks: []idem.Hook{seen}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msgs := make([]idem.Message, 3)
	d := idem.Delivery{System: "nats", Destination: "orders"}
	for i := range msgs {
		msgs[i] = idem.Message{ID: fmt.Sprintf("m%d", i), Payload: []byte("p"), Headers: idem.Headers{"traceparent": {fmt.Sprintf("trace-%d", i)}}}
		d.BatchHeaders = append(d.BatchHeaders, msgs[i].Headers)
	}
	ctx := idem.WithDelivery(t.Context(), d)
	atts, outs, err := c.AcquireBatch(ctx, msgs, idem.AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range atts {
		if a == nil {
			t.Fatalf("%s not held: %v", msgs[i].ID, outs[i].Err)
		}
		want := fmt.Sprintf("trace-%d", i)
		if got := seen.seen[msgs[i].ID]; got != want {
			t.Errorf("%s: the start hook saw trace header %q, want %q", msgs[i].ID, got, want)
		}
		if dl, ok := idem.DeliveryFromContext(a.Context()); !ok || dl.Header == nil || dl.Header.Get("traceparent") != want || dl.System != "nats" || dl.BatchHeaders != nil {
			t.Errorf("%s: the attempt's Delivery %+v (%v), want nats with its own header %q", msgs[i].ID, dl, ok, want)
		}
		_, _ = a.Abandon(ctx, nil)
	}
}

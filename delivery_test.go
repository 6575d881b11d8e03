package idem_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

func TestDeliveryContext(t *testing.T) {
	t.Parallel()
	if _, ok := idem.DeliveryFromContext(context.Background()); ok {
		t.Fatal("a bare context has a Delivery")
	}
	h := idem.Headers{"traceparent": {"00-x", "second"}, "bytes": {"b"}, "n": {"7"}, "nil": nil}
	ctx := idem.WithDelivery(context.Background(), idem.Delivery{System: "kafka", Destination: "payments", Header: h})
	d, ok := idem.DeliveryFromContext(ctx)
	if !ok || d.System != "kafka" || d.Destination != "payments" {
		t.Fatalf("DeliveryFromContext = %+v, %v", d, ok)
	}
	for k, want := range map[string]string{"traceparent": "00-x", "bytes": "b", "n": "7", "nil": "", "absent": ""} {
		if got := d.Header.Get(k); got != want {
			t.Errorf("Get(%q) = %q, want %q", k, got, want)
		}
	}
	keys := d.Header.Keys()
	slices.Sort(keys)
	if !slices.Equal(keys, []string{"bytes", "n", "nil", "traceparent"}) {
		t.Errorf("Keys() = %v", keys)
	}
}

// TestDeliveryContextDerived: the context WithDelivery makes passes the
// parent's values, deadline and cancellation (with its cause) to the
// contexts derived from it, which still carry the Delivery; a copy read
// back is not changed by changing another.
func TestDeliveryContextDerived(t *testing.T) {
	t.Parallel()
	type key struct{}
	cause := errors.New("stopped")
	dl := time.Now().Add(time.Hour)
	parent, cancelDL := context.WithDeadline(context.WithValue(context.Background(), key{}, "v"), dl)
	defer cancelDL()
	parent, cancel := context.WithCancelCause(parent)
	ctx := idem.WithDelivery(parent, idem.Delivery{System: "nats", Destination: "orders.1"})
	child, stop := context.WithCancel(ctx)
	defer stop()
	if got := child.Value(key{}); got != "v" {
		t.Fatalf("a parent's value through the Delivery: %v", got)
	}
	if got, ok := child.Deadline(); !ok || !got.Equal(dl) {
		t.Fatalf("Deadline = %v, %v; want %v", got, ok, dl)
	}
	d, ok := idem.DeliveryFromContext(child)
	if !ok || d.System != "nats" || d.Destination != "orders.1" {
		t.Fatalf("DeliveryFromContext(child) = %+v, %v", d, ok)
	}
	d.System = "changed"
	if d2, _ := idem.DeliveryFromContext(ctx); d2.System != "nats" {
		t.Fatalf("a copy's change reached the context: %q", d2.System)
	}
	cancel(cause)
	<-child.Done() // closed by the parent's cancellation, or the test times out
	if !errors.Is(context.Cause(child), cause) || !errors.Is(context.Cause(ctx), cause) || ctx.Err() != context.Canceled {
		t.Fatalf("Cause(child) = %v, Cause(ctx) = %v, Err = %v", context.Cause(child), context.Cause(ctx), ctx.Err())
	}
	if s := fmt.Sprint(ctx); !strings.HasSuffix(s, ".WithDelivery") {
		t.Fatalf("String = %q", s)
	}
}

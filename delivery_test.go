package idem_test

import (
	"context"
	"slices"
	"testing"

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

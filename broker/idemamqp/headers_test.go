package idemamqp

import (
	"reflect"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
)

func TestDeliveryHeaders(t *testing.T) {
	t.Parallel()
	if h := deliveryHeaders(&amqp.Delivery{}); h != nil {
		t.Errorf("no headers: %v, want nil", h)
	}
	d := &amqp.Delivery{Headers: amqp.Table{"trace": "a", "n": int32(3)}, ContentType: "application/json", CorrelationId: "c-1"}
	want := idem.Headers{"trace": {"a"}, "n": {"3"}, "Content-Type": {"application/json"}, "Correlation-Id": {"c-1"}}
	if h := deliveryHeaders(d); !reflect.DeepEqual(h, want) {
		t.Errorf("deliveryHeaders = %v, want %v", h, want)
	}
}

package oteltest

import (
	"context"
	"fmt"
	"maps"
	"testing"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemotel"
)

// TestRedeliveriesCounted checks what idemotel's Example says: one
// delivery and two redeliveries of pay-1 add 1 to idem.messages with
// idem.status=processed and no duplicate reason, and 2 with
// idem.status=duplicate and idem.duplicate.reason=completed, both labelled
// with the consumer, and nothing else.
func TestRedeliveriesCounted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.consumer(t, idem.Config{Name: "payments"})
	charge := func(context.Context, *idem.MemoryTx, idem.Message) error { return nil }
	msg := idem.Message{ID: "pay-1", Payload: []byte(`{"cents":100}`)}
	for range 3 {
		if _, err := c.Process(t.Context(), msg, charge); err != nil {
			t.Fatal(err)
		}
	}

	m, ok := b.collect(t)["idem.messages"]
	if !ok {
		t.Fatal("no idem.messages")
	}
	got := map[string]int64{}
	for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
		status, _ := p.Attributes.Value(idemotel.StatusKey)
		reason, _ := p.Attributes.Value(idemotel.DuplicateReasonKey)
		consumer, _ := p.Attributes.Value(idemotel.ConsumerKey)
		got[fmt.Sprintf("%s status=%s reason=%q", consumer.Emit(), status.Emit(), reason.Emit())] += p.Value
	}
	want := map[string]int64{
		`payments status=processed reason=""`:          1,
		`payments status=duplicate reason="completed"`: 2,
	}
	if !maps.Equal(got, want) {
		t.Fatalf("idem.messages points %v, want %v", got, want)
	}
}

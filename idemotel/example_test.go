package idemotel_test

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemotel"
)

// A consumer with the Observer as its hook counts a redelivery as a
// duplicate absorbed, labelled with the consumer and the reason.
func Example() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	obs, err := idemotel.NewObserver(idemotel.WithMeterProvider(mp), idemotel.WithMessagingSystem("kafka"))
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
		_, _ = c.Process(context.Background(), msg, charge)
	}

	var rm metricdata.ResourceMetrics
	_ = reader.Collect(context.Background(), &rm)
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if m.Name != "idem.messages" {
			continue
		}
		for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
			status, _ := p.Attributes.Value(idemotel.StatusKey)
			reason, _ := p.Attributes.Value(idemotel.DuplicateReasonKey)
			group, _ := p.Attributes.Value(attribute.Key("idem.consumer"))
			fmt.Printf("%s %s status=%s reason=%q: %d\n", m.Name, group.Emit(), status.Emit(), reason.Emit(), p.Value)
		}
	}
	// Unordered output:
	// idem.messages payments status=processed reason="": 1
	// idem.messages payments status=duplicate reason="completed": 2
}

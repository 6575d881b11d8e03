package oteltest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemotel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// statsOnly is an OutboxStore whose only working method is OutboxStats.
type statsOnly struct {
	idemdriver.OutboxStore
	stats idemdriver.OutboxStats
}

func (s statsOnly) OutboxStats(context.Context) (idemdriver.OutboxStats, error) { return s.stats, nil }

// TestOutboxObserver checks the outbox metrics: emitted, sent and failed
// counts from the hooks, the relay's duration and lag, and the backlog
// gauges read from the store at collection.
func TestOutboxObserver(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	store := statsOnly{stats: idemdriver.OutboxStats{Pending: 7, Failed: 2, OldestPending: 3 * time.Second}}
	obs, err := idemotel.NewOutboxObserver(store, idemotel.WithMeterProvider(mp), idemotel.WithMessagingSystem("nats"))
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close()
	ctx := t.Context()
	obs.OnEmit(ctx, idem.EmitEvent{Consumer: "payments", MessageID: "m", Count: 2})
	obs.OnRelay(ctx, idem.RelayEvent{Result: idem.RelayResult{Claimed: 4, Sent: 2, Retried: 1, Failed: 1}, Latency: 10 * time.Millisecond, OldestAge: 1500 * time.Millisecond})
	obs.OnRelay(ctx, idem.RelayEvent{Err: errors.New("claim failed"), Latency: time.Millisecond})

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	ms := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			ms[m.Name] = m
		}
	}
	for _, c := range []struct {
		name  string
		attrs map[string]string
		want  int64
	}{
		{"idem.outbox.emitted", map[string]string{"messaging.consumer.group.name": "payments", "messaging.system": "nats"}, 2},
		{"idem.outbox.sent", nil, 2},
		{"idem.outbox.send_failures", map[string]string{"idem.outbox.failure": "retryable"}, 1},
		{"idem.outbox.send_failures", map[string]string{"idem.outbox.failure": "permanent"}, 1},
	} {
		if got := sum(t, ms, c.name, c.attrs); got != c.want {
			t.Errorf("%s%v = %d, want %d", c.name, c.attrs, got, c.want)
		}
	}
	if n := histCount(t, ms, "idem.outbox.relay.duration", nil); n != 2 {
		t.Errorf("relay.duration recordings = %d, want 2", n)
	}
	gaugeI := func(name string) int64 {
		g, ok := ms[name].Data.(metricdata.Gauge[int64])
		if !ok || len(g.DataPoints) != 1 {
			t.Fatalf("%s = %#v, want one int64 gauge point", name, ms[name].Data)
		}
		return g.DataPoints[0].Value
	}
	gaugeF := func(name string) float64 {
		g, ok := ms[name].Data.(metricdata.Gauge[float64])
		if !ok || len(g.DataPoints) != 1 {
			t.Fatalf("%s = %#v, want one float64 gauge point", name, ms[name].Data)
		}
		return g.DataPoints[0].Value
	}
	if p, f, o, lag := gaugeI("idem.outbox.pending"), gaugeI("idem.outbox.failed"), gaugeF("idem.outbox.oldest_pending"), gaugeF("idem.outbox.relay.lag"); p != 7 || f != 2 || o != 3 || lag != 1.5 {
		t.Errorf("pending %d, failed %d, oldest_pending %vs, relay.lag %vs; want 7, 2, 3s, 1.5s", p, f, o, lag)
	}
}

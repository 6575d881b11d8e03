package idemotel

import (
	"context"
	"errors"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// OutboxFailureKey is the attribute of idem.outbox.send_failures: retryable
// (the row waits for its backoff) or permanent (the row is failed for good).
const OutboxFailureKey = attribute.Key("idem.outbox.failure")

// OutboxObserver records the transactional outbox's metrics: a consumer
// hook (idem.HookEmit) and a relay hook (idem.HookRelay), and, when it is
// given the store, the backlog read at each collection.
//
//	name                         instrument               unit       attributes                  meaning
//	idem.outbox.emitted          Int64Counter             {message}  messaging.consumer.group.name  outgoing messages committed by handlers
//	idem.outbox.sent             Int64Counter             {message}                              messages a relay's publisher confirmed
//	idem.outbox.send_failures    Int64Counter             {message}  idem.outbox.failure         failed publishes (retryable, permanent)
//	idem.outbox.relay.duration   Float64Histogram         s                                      one relay round: claim, publish, marks
//	idem.outbox.relay.lag        Float64Gauge             s                                      the oldest row a round claimed: its age
//	idem.outbox.pending          Int64ObservableGauge     {message}                              rows not yet sent (with a store)
//	idem.outbox.failed           Int64ObservableGauge     {message}                              rows failed for good, until purged
//	idem.outbox.oldest_pending   Float64ObservableGauge   s                                      age of the oldest unsent row: the
//	                                                                                             relay lag as the store sees it
//
// The observable gauges query the store (idemdriver.OutboxStore.OutboxStats)
// once per collection; Close unregisters them.
type OutboxObserver struct {
	emitted, sent, failures metric.Int64Counter
	relayDur                metric.Float64Histogram
	relayLag                metric.Float64Gauge
	reg                     metric.Registration
	system                  attribute.KeyValue
}

// The hook interfaces the OutboxObserver implements.
var (
	_ idem.HookEmit  = (*OutboxObserver)(nil)
	_ idem.HookRelay = (*OutboxObserver)(nil)
)

// NewOutboxObserver returns an OutboxObserver on the meter provider of
// opts (WithMeterProvider, WithMessagingSystem; the tracer provider is not
// used). store may be nil: then the backlog gauges are not registered.
// Errors: ErrInvalidOption for a bad option, or the meter's.
func NewOutboxObserver(store idemdriver.OutboxStore, opts ...Option) (*OutboxObserver, error) {
	var o options
	for _, opt := range opts {
		if err := opt.apply(&o); err != nil {
			return nil, err
		}
	}
	if o.mp == nil {
		o.mp = otel.GetMeterProvider()
	}
	m := o.mp.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL))
	obs := &OutboxObserver{}
	if o.system != "" {
		obs.system = semconv.MessagingSystemKey.String(o.system)
	}
	var errs []error
	ic := func(name, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit("{message}"), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	obs.emitted = ic("idem.outbox.emitted", "Outgoing messages committed to the outbox by handlers.")
	obs.sent = ic("idem.outbox.sent", "Outbox messages a relay's publisher confirmed.")
	obs.failures = ic("idem.outbox.send_failures", "Outbox messages whose publish failed, retryable or permanent.")
	var err error
	obs.relayDur, err = m.Float64Histogram("idem.outbox.relay.duration", metric.WithUnit("s"),
		metric.WithDescription("One relay round: claim, publish and marks."),
		metric.WithExplicitBucketBoundaries(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
	errs = append(errs, err)
	obs.relayLag, err = m.Float64Gauge("idem.outbox.relay.lag", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest outbox row the last relay round claimed."))
	errs = append(errs, err)
	if store != nil {
		pending, err1 := m.Int64ObservableGauge("idem.outbox.pending", metric.WithUnit("{message}"),
			metric.WithDescription("Outbox rows not yet sent."))
		failed, err2 := m.Int64ObservableGauge("idem.outbox.failed", metric.WithUnit("{message}"),
			metric.WithDescription("Outbox rows failed for good, until purged."))
		oldest, err3 := m.Float64ObservableGauge("idem.outbox.oldest_pending", metric.WithUnit("s"),
			metric.WithDescription("Age of the oldest unsent outbox row, by the store's clock."))
		errs = append(errs, err1, err2, err3)
		if err1 == nil && err2 == nil && err3 == nil {
			obs.reg, err = m.RegisterCallback(func(ctx context.Context, ob metric.Observer) error {
				s, err := store.OutboxStats(ctx)
				if err != nil {
					return err
				}
				attrs := obs.attrs()
				ob.ObserveInt64(pending, s.Pending, attrs)
				ob.ObserveInt64(failed, s.Failed, attrs)
				ob.ObserveFloat64(oldest, s.OldestPending.Seconds(), attrs)
				return nil
			}, pending, failed, oldest)
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return obs, nil
}

func (o *OutboxObserver) attrs(kv ...attribute.KeyValue) metric.MeasurementOption {
	if o.system.Key != "" {
		kv = append(kv, o.system)
	}
	return metric.WithAttributes(kv...)
}

// OnEmit counts committed outgoing messages; implements idem.HookEmit.
func (o *OutboxObserver) OnEmit(ctx context.Context, e idem.EmitEvent) {
	o.emitted.Add(ctx, int64(e.Count), o.attrs(semconv.MessagingConsumerGroupName(e.Consumer)))
}

// OnRelay records a relay round; implements idem.HookRelay.
func (o *OutboxObserver) OnRelay(ctx context.Context, e idem.RelayEvent) {
	attrs := o.attrs()
	o.relayDur.Record(ctx, e.Latency.Seconds(), attrs)
	if e.Result.Sent > 0 {
		o.sent.Add(ctx, int64(e.Result.Sent), attrs)
	}
	if e.Result.Retried > 0 {
		o.failures.Add(ctx, int64(e.Result.Retried), o.attrs(OutboxFailureKey.String("retryable")))
	}
	if e.Result.Failed > 0 {
		o.failures.Add(ctx, int64(e.Result.Failed), o.attrs(OutboxFailureKey.String("permanent")))
	}
	if e.Result.Claimed > 0 {
		o.relayLag.Record(ctx, e.OldestAge.Seconds(), attrs)
	}
}

// Close unregisters the backlog gauges' callback; idempotent.
func (o *OutboxObserver) Close() error {
	if o.reg == nil {
		return nil
	}
	err := o.reg.Unregister()
	o.reg = nil
	return err
}

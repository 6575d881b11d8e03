package idemotel

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
)

// WithPropagator sets the propagator that reads the trace context of a
// delivery's headers (idem.Delivery.Header, set by the broker adapters and
// idemhttp). Defaults to otel.GetTextMapPropagator() at each delivery, or,
// while that global is the default no-op one, W3C Trace Context and
// Baggage (propagation.TraceContext, propagation.Baggage). A nil
// propagator is refused with ErrInvalidOption.
func WithPropagator(p propagation.TextMapPropagator) Option {
	return optionFunc(func(o *options) error {
		if p == nil {
			return fmt.Errorf("%w: nil TextMapPropagator", ErrInvalidOption)
		}
		o.prop = p
		return nil
	})
}

// w3c is the propagator used while the global one is the no-op default.
var w3c = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// defaultPropagator is otel's global propagator, or W3C Trace Context and
// Baggage while the global one propagates nothing.
func defaultPropagator() propagation.TextMapPropagator {
	if p := otel.GetTextMapPropagator(); len(p.Fields()) > 0 {
		return p
	}
	return w3c
}

// InjectTraceContext is an idem.HeaderInjector that writes the trace
// context of ctx (the span that publishes: traceparent and tracestate, and
// baggage) with the default propagator (see WithPropagator). Give it to a
// producer: idemnats.WithHeaderInjector(idemotel.InjectTraceContext), or
// InjectHeaders in idemkafka's, idemamqp's and idemredisstream's
// ProducerConfig, and idemhttp.ProxyOptions. It writes nothing when ctx
// holds no span.
func InjectTraceContext(ctx context.Context, set func(key, value string)) {
	defaultPropagator().Inject(ctx, setter(set))
}

// NewHeaderInjector returns an idem.HeaderInjector like InjectTraceContext
// that injects with p.
func NewHeaderInjector(p propagation.TextMapPropagator) idem.HeaderInjector {
	return func(ctx context.Context, set func(key, value string)) { p.Inject(ctx, setter(set)) }
}

// setter is the write-only TextMapCarrier of a HeaderInjector's set.
type setter func(key, value string)

func (s setter) Get(string) string     { return "" }
func (s setter) Set(key, value string) { s(key, value) }
func (s setter) Keys() []string        { return nil }

// getter is the read-only TextMapCarrier of an idem.HeaderCarrier.
type getter struct{ idem.HeaderCarrier }

func (getter) Set(string, string) {}

// propagator is the Observer's propagator: the configured one, else the
// default.
func (o *Observer) propagator() propagation.TextMapPropagator {
	if o.prop != nil {
		return o.prop
	}
	return defaultPropagator()
}

// parent returns the context to start d's process span in, and its links:
// the creation context of each message carried in its headers. A single
// message's creation context is linked and, when ctx has no span of its
// own (a broker adapter's loop has none), is also the parent, so that one
// trace runs from the publish to the handler's effects; under an ambient
// span (a traced HTTP server, a caller's span) the ambient span stays the
// parent and the creation context is only linked, as the OpenTelemetry
// messaging conventions advise. Requests (no System) are not linked: the
// caller's context is only the parent, when ctx has none.
func (o *Observer) parent(ctx context.Context, d idem.Delivery) (context.Context, []trace.Link) {
	prop := o.propagator()
	var links []trace.Link
	link := func(h idem.HeaderCarrier) trace.SpanContext {
		sc := trace.SpanContextFromContext(prop.Extract(context.Background(), getter{h}))
		if sc.IsValid() && d.System != "" {
			links = append(links, trace.Link{SpanContext: sc})
		}
		return sc
	}
	if d.Header != nil {
		if sc := link(d.Header); sc.IsValid() && !trace.SpanContextFromContext(ctx).IsValid() {
			ctx = prop.Extract(ctx, getter{d.Header})
		}
	}
	for _, h := range d.BatchHeaders {
		if h != nil {
			link(h)
		}
	}
	return ctx, links
}

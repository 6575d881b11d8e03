package idemotel

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// ScopeName is the instrumentation scope of the meter and the tracer.
const ScopeName = "github.com/idem-go/idem/idemotel"

// Attribute keys of the idem namespace; see the package doc for their values.
const (
	// ConsumerKey is the idem consumer name: the identity deduplication is
	// keyed by (idem.Config.Name), on every metric and span. It is not a
	// broker's consumer group (messaging.consumer.group.name), which the
	// adapters report separately when the broker has one.
	ConsumerKey = attribute.Key("idem.consumer")
	// ModeKey is the claim mode: "transactional" or "lease" (idem.Mode.String).
	ModeKey = attribute.Key("idem.mode")
	// StatusKey is a delivery's outcome: processed, duplicate, in_progress,
	// fingerprint_mismatch, failed, poison or rejected.
	StatusKey = attribute.Key("idem.status")
	// DuplicateReasonKey is why a delivery found its message known
	// (idem.DuplicateReason.String); absent when it did not.
	DuplicateReasonKey = attribute.Key("idem.duplicate.reason")
	// StoreOperationKey names a store call (idem.StoreErrorEvent.Op,
	// idem.LeaseEvent.Op).
	StoreOperationKey = attribute.Key("idem.store.operation")
	// PurgeResultKey is a purge's result: ok, skipped or error.
	PurgeResultKey = attribute.Key("idem.purge.result")
	// AttemptKey is the lease-mode attempt number (spans only).
	AttemptKey = attribute.Key("idem.attempt")
	// RecordIDKey is the record ID of an idemhttp request (the hashed
	// scope and the Idempotency-Key; spans only, in place of
	// messaging.message.id).
	RecordIDKey = attribute.Key("idem.record.id")
	// ReplayedKey tells whether an idemhttp response was a stored one
	// replayed (idemhttp.ResponseEvent.Replayed; idem.http.responses only).
	ReplayedKey = attribute.Key("idem.http.replayed")
)

// HTTPConsumerPrefix starts the consumer name of every idemhttp middleware
// ("idemhttp:" and its namespace). The Observer treats such a consumer's
// deliveries as HTTP requests: see "HTTP requests" in the package doc.
const HTTPConsumerPrefix = "idemhttp:"

// isHTTP reports whether consumer is an idemhttp middleware's.
func isHTTP(consumer string) bool { return strings.HasPrefix(consumer, HTTPConsumerPrefix) }

// ErrInvalidOption is matched (errors.Is) by the error NewObserver returns
// for a bad option.
var ErrInvalidOption = errors.New("idemotel: invalid option")

// Option configures NewObserver.
type Option interface{ apply(*options) error }

type optionFunc func(*options) error

func (f optionFunc) apply(o *options) error { return f(o) }

type options struct {
	mp     metric.MeterProvider
	tp     trace.TracerProvider
	system string
	prop   propagation.TextMapPropagator
}

// WithMeterProvider sets the meter provider. Defaults to
// otel.GetMeterProvider() at the time of NewObserver. A nil provider is
// refused with ErrInvalidOption.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(o *options) error {
		if mp == nil {
			return fmt.Errorf("%w: nil MeterProvider", ErrInvalidOption)
		}
		o.mp = mp
		return nil
	})
}

// WithTracerProvider sets the tracer provider. Defaults to
// otel.GetTracerProvider() at the time of NewObserver; pass
// noop.NewTracerProvider() for metrics only. A nil provider is refused
// with ErrInvalidOption.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(o *options) error {
		if tp == nil {
			return fmt.Errorf("%w: nil TracerProvider", ErrInvalidOption)
		}
		o.tp = tp
		return nil
	})
}

// WithMessagingSystem sets the messaging.system attribute of the metrics
// and spans of deliveries that carry no idem.Delivery (a direct Process
// call, or an adapter of your own); a broker adapter's delivery names its
// own system, which wins. Left out by default.
func WithMessagingSystem(system string) Option {
	return optionFunc(func(o *options) error {
		o.system = system
		return nil
	})
}

// Observer is an idem hook (see idem.Hook) that records the metrics and
// spans listed in the package doc. It implements every idem.Hook*
// interface and idemhttp.HookResponse, is safe for concurrent use, and may
// be shared by consumers and idemhttp middlewares.
type Observer struct {
	tracer trace.Tracer
	system attribute.KeyValue // empty Key when unset
	prop   propagation.TextMapPropagator

	messages       metric.Int64Counter
	claims         metric.Int64Counter
	claimsActive   metric.Int64UpDownCounter
	claimsReleased metric.Int64Counter
	processDur     metric.Float64Histogram
	httpDur        metric.Float64Histogram
	httpResponses  metric.Int64Counter
	claimDur       metric.Float64Histogram
	renewals       metric.Int64Counter
	takeovers      metric.Int64Counter
	leaseLost      metric.Int64Counter
	purgeRuns      metric.Int64Counter
	purgeRows      metric.Int64Counter
	purgeDur       metric.Float64Histogram
	purgeLag       metric.Float64Gauge
	purgeLoad      metric.Float64Gauge
	storeErrors    metric.Int64Counter
}

// The hook interfaces the Observer implements.
var (
	_ idem.HookProcessStart   = (*Observer)(nil)
	_ idem.HookProcessEnd     = (*Observer)(nil)
	_ idem.HookClaim          = (*Observer)(nil)
	_ idem.HookOutcome        = (*Observer)(nil)
	_ idem.HookLeaseRenewed   = (*Observer)(nil)
	_ idem.HookLeaseTakenOver = (*Observer)(nil)
	_ idem.HookLeaseLost      = (*Observer)(nil)
	_ idem.HookPurge          = (*Observer)(nil)
	_ idem.HookStoreError     = (*Observer)(nil)

	_ idemhttp.HookResponse = (*Observer)(nil)
)

// NewObserver returns an Observer that creates its instruments on the
// meter provider and its spans on the tracer provider of opts. It returns
// an error matching ErrInvalidOption for a bad option, or the meter's error
// when an instrument cannot be created.
func NewObserver(opts ...Option) (*Observer, error) {
	var o options
	for _, opt := range opts {
		if err := opt.apply(&o); err != nil {
			return nil, err
		}
	}
	if o.mp == nil {
		o.mp = otel.GetMeterProvider()
	}
	if o.tp == nil {
		o.tp = otel.GetTracerProvider()
	}
	m := o.mp.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL))
	obs := &Observer{tracer: o.tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL)), prop: o.prop}
	if o.system != "" {
		obs.system = semconv.MessagingSystemKey.String(o.system)
	}
	var errs []error
	ic := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	hist := func(name, desc string, bounds ...float64) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc), metric.WithExplicitBucketBoundaries(bounds...))
		errs = append(errs, err)
		return h
	}
	obs.messages = ic("idem.messages", "{message}", "Deliveries settled by an idem consumer, by outcome and duplicate reason.")
	obs.claims = ic("idem.claims", "{claim}", "New claims: deliveries whose handler ran.")
	var err error
	obs.claimsActive, err = m.Int64UpDownCounter("idem.claims.active", metric.WithUnit("{claim}"),
		metric.WithDescription("Claims in progress: claimed and not yet settled."))
	errs = append(errs, err)
	obs.claimsReleased = ic("idem.claims.released", "{claim}", "Claims given up after an error so that a redelivery runs the handler again.")
	// The semantic conventions' advice for messaging durations.
	obs.processDur = hist("messaging.process.duration", "Duration of one idem Process, ProcessTx or ProcessBatch call.",
		0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10)
	obs.httpDur = hist("idem.http.request.duration", "Duration of one request on the idempotency path of an idemhttp middleware.",
		0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10)
	obs.httpResponses = ic("idem.http.responses", "{response}", "Answers to requests on the idempotency path of an idemhttp middleware, by status code.")
	obs.claimDur = hist("idem.claim.duration", "Round trip of a claim to the store.",
		0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
	obs.renewals = ic("idem.lease.renewals", "{renewal}", "Lease renewals that succeeded.")
	obs.takeovers = ic("idem.lease.takeovers", "{takeover}", "Lease-mode attempts after the first: retries after a release and takeovers of expired leases.")
	obs.leaseLost = ic("idem.lease.lost", "{write}", "Writes rejected because another attempt owns the message (complete: a stale completion).")
	obs.purgeRuns = ic("idem.purge.runs", "{run}", "Purges of processed records, by result.")
	obs.purgeRows = ic("idem.purge.rows", "{row}", "Processed records purged.")
	obs.purgeDur = hist("idem.purge.duration", "Duration of a purge.", 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300)
	obs.purgeLag, err = m.Float64Gauge("idem.purge.lag", metric.WithUnit("s"),
		metric.WithDescription("How far the purge horizon trails now minus the retention window: the newest record's age."))
	errs = append(errs, err)
	obs.purgeLoad, err = m.Float64Gauge("idem.purge.load", metric.WithUnit("1"),
		metric.WithDescription("A purge's duration over the span of records it deleted: at or above 1 the purge deletes more slowly than records become purgeable."))
	errs = append(errs, err)
	obs.storeErrors = ic("idem.store.errors", "{error}", "Store calls that failed.")
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return obs, nil
}

// attrs returns the attribute set of a measurement: the consumer, the
// delivery's messaging attributes (see messaging), and kv.
func (o *Observer) attrs(ctx context.Context, consumer string, kv ...attribute.KeyValue) metric.MeasurementOption {
	all := make([]attribute.KeyValue, 0, len(kv)+4)
	all = append(all, ConsumerKey.String(consumer))
	all = o.messaging(ctx, consumer, all, false)
	return metric.WithAttributes(append(all, kv...)...)
}

// messaging appends the messaging attributes of the delivery in ctx to kv:
// messaging.system (the adapter's, else WithMessagingSystem's, never for
// an idemhttp consumer), messaging.consumer.group.name when the broker has
// a consumer group, and the destination: on spans messaging.destination.name
// and messaging.destination.template (when the adapter gives one); on
// metrics the template when there is one, else the name (the conventions
// keep a possibly high-cardinality name off metrics).
func (o *Observer) messaging(ctx context.Context, consumer string, kv []attribute.KeyValue, span bool) []attribute.KeyValue {
	if isHTTP(consumer) {
		return kv
	}
	d, _ := idem.DeliveryFromContext(ctx)
	switch {
	case d.System != "":
		kv = append(kv, semconv.MessagingSystemKey.String(d.System))
	case o.system.Key != "":
		kv = append(kv, o.system)
	}
	if d.ConsumerGroup != "" {
		kv = append(kv, semconv.MessagingConsumerGroupName(d.ConsumerGroup))
	}
	switch {
	case span:
		if d.Destination != "" {
			kv = append(kv, semconv.MessagingDestinationName(d.Destination))
		}
		if d.DestinationTemplate != "" {
			kv = append(kv, semconv.MessagingDestinationTemplate(d.DestinationTemplate))
		}
	case d.DestinationTemplate != "":
		kv = append(kv, semconv.MessagingDestinationTemplate(d.DestinationTemplate))
	case d.Destination != "":
		kv = append(kv, semconv.MessagingDestinationName(d.Destination))
	}
	return kv
}

// spanState is what OnProcessStart leaves in the context for the later
// hooks of the same call.
type spanState struct {
	span   trace.Span
	status string // single delivery: set by OnOutcome
}

type stateKey struct{}

// OnProcessStart starts the process span; implements idem.HookProcessStart.
// The span continues the trace context of the delivery's headers
// (idem.Delivery, see WithPropagator): a child of the message's creation
// context, linked to it, or only linked under an ambient span.
func (o *Observer) OnProcessStart(ctx context.Context, e idem.ProcessStartEvent) context.Context {
	d, _ := idem.DeliveryFromContext(ctx)
	parent, links := o.parent(ctx, d)
	if isHTTP(e.Consumer) {
		kv := []attribute.KeyValue{ConsumerKey.String(e.Consumer), ModeKey.String(e.Mode.String())}
		if e.MessageID != "" {
			kv = append(kv, RecordIDKey.String(e.MessageID))
		}
		ctx, span := o.tracer.Start(parent, "idempotency "+e.Consumer, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(kv...))
		return context.WithValue(ctx, stateKey{}, &spanState{span: span})
	}
	kv := []attribute.KeyValue{
		semconv.MessagingOperationName("process"), semconv.MessagingOperationTypeProcess,
		ConsumerKey.String(e.Consumer), ModeKey.String(e.Mode.String()),
	}
	kv = o.messaging(ctx, e.Consumer, kv, true)
	if e.BatchSize > 0 {
		kv = append(kv, semconv.MessagingBatchMessageCount(e.BatchSize))
	} else if e.MessageID != "" {
		kv = append(kv, semconv.MessagingMessageID(e.MessageID))
	}
	name := "process"
	if d.Destination != "" {
		name += " " + d.Destination
	}
	ctx, span := o.tracer.Start(parent, name, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(kv...), trace.WithLinks(links...))
	return context.WithValue(ctx, stateKey{}, &spanState{span: span})
}

// OnProcessEnd records messaging.process.duration (not for an idemhttp
// middleware's requests, which OnResponse times) and ends the span;
// implements idem.HookProcessEnd.
func (o *Observer) OnProcessEnd(ctx context.Context, e idem.ProcessEndEvent) {
	st, _ := ctx.Value(stateKey{}).(*spanState)
	var errType string
	if e.Err != nil {
		errType = errorType(e.Err)
	}
	if !isHTTP(e.Consumer) {
		kv := []attribute.KeyValue{ModeKey.String(e.Mode.String()), semconv.MessagingOperationName("process")}
		if st != nil && st.status != "" {
			kv = append(kv, StatusKey.String(st.status))
		}
		if e.Err != nil {
			kv = append(kv, semconv.ErrorTypeKey.String(errType))
		}
		o.processDur.Record(ctx, e.Latency.Seconds(), o.attrs(ctx, e.Consumer, kv...))
	}
	if st != nil {
		if e.Err != nil {
			st.span.SetAttributes(semconv.ErrorTypeKey.String(errType))
		}
		st.span.End()
	}
}

// OnClaim counts a claim; implements idem.HookClaim.
func (o *Observer) OnClaim(ctx context.Context, e idem.ClaimEvent) {
	mode := o.attrs(ctx, e.Consumer, ModeKey.String(e.Mode.String()))
	o.claims.Add(ctx, 1, mode)
	o.claimsActive.Add(ctx, 1, mode)
	o.claimDur.Record(ctx, e.Latency.Seconds(), mode)
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		kv := []attribute.KeyValue{semconv.MessagingMessageID(e.MessageID)}
		if isHTTP(e.Consumer) {
			kv[0] = RecordIDKey.String(e.MessageID)
		}
		if e.Attempt > 0 {
			kv = append(kv, AttemptKey.Int(e.Attempt))
		}
		span.AddEvent("idem.claim", trace.WithAttributes(kv...))
	}
}

// OnOutcome counts a settled delivery; implements idem.HookOutcome.
func (o *Observer) OnOutcome(ctx context.Context, e idem.OutcomeEvent) {
	status := statusName(e.Outcome)
	mode := ModeKey.String(e.Mode.String())
	kv := []attribute.KeyValue{mode, StatusKey.String(status)}
	if e.Reason != idem.NotDuplicate {
		kv = append(kv, DuplicateReasonKey.String(e.Reason.String()))
	}
	o.messages.Add(ctx, 1, o.attrs(ctx, e.Consumer, kv...))
	if e.Claimed {
		o.claimsActive.Add(ctx, -1, o.attrs(ctx, e.Consumer, mode))
	}
	if e.Released {
		o.claimsReleased.Add(ctx, 1, o.attrs(ctx, e.Consumer, mode))
	}
	st, _ := ctx.Value(stateKey{}).(*spanState)
	if st == nil {
		return
	}
	if e.BatchSize > 0 {
		// A batch span keeps the batch's attributes only, but is an
		// error when one of its messages is.
		switch e.Outcome.Status {
		case idem.Failed, idem.Rejected, idem.FingerprintMismatch:
			st.span.SetStatus(codes.Error, status)
		}
		return
	}
	st.status = status
	kv = []attribute.KeyValue{StatusKey.String(status)}
	if e.Reason != idem.NotDuplicate {
		kv = append(kv, DuplicateReasonKey.String(e.Reason.String()))
	}
	if e.Outcome.Attempt > 0 {
		kv = append(kv, AttemptKey.Int(e.Outcome.Attempt))
	}
	st.span.SetAttributes(kv...)
	switch e.Outcome.Status {
	case idem.Failed, idem.Rejected, idem.FingerprintMismatch:
		st.span.RecordError(e.Outcome.Err)
		st.span.SetStatus(codes.Error, status)
	}
}

// OnResponse records the answer of a request on an idemhttp middleware's
// idempotency path: idem.http.request.duration and idem.http.responses,
// and http.response.status_code on the span of ctx (the request's
// context, the HTTP server span's when the server is traced) when it is
// recording. It sees every request on the path, those answered before
// their key reached the store (which produce no core events) included;
// implements idemhttp.HookResponse.
func (o *Observer) OnResponse(ctx context.Context, e idemhttp.ResponseEvent) {
	var code attribute.KeyValue
	if e.Status != 0 {
		code = semconv.HTTPResponseStatusCode(e.Status)
	}
	var status attribute.KeyValue
	switch {
	case e.Outcome != 0:
		status = StatusKey.String(statusName(idem.Outcome{Status: e.Outcome}))
	case e.Status >= 400:
		status = StatusKey.String("rejected")
	}
	kv := make([]attribute.KeyValue, 0, 5)
	if e.Method != "" {
		kv = append(kv, httpMethod(e.Method))
	}
	if e.Route != "" {
		kv = append(kv, semconv.HTTPRoute(e.Route))
	}
	for _, a := range []attribute.KeyValue{code, status} {
		if a.Key != "" {
			kv = append(kv, a)
		}
	}
	o.httpResponses.Add(ctx, 1, o.attrs(ctx, e.Consumer, append(kv, ReplayedKey.Bool(e.Replayed))...))
	if errType := httpErrorType(e); errType != "" {
		kv = append(kv, semconv.ErrorTypeKey.String(errType))
	}
	o.httpDur.Record(ctx, e.Latency.Seconds(), o.attrs(ctx, e.Consumer, kv...))
	if span := trace.SpanFromContext(ctx); e.Status != 0 && span.IsRecording() {
		span.SetAttributes(code)
	}
}

// httpMethod is the http.request.method of method: one of the methods the
// HTTP conventions know, else "_OTHER" (a bounded set).
func httpMethod(method string) attribute.KeyValue {
	switch method {
	case http.MethodConnect, http.MethodDelete, http.MethodGet, http.MethodHead, http.MethodOptions,
		http.MethodPatch, http.MethodPost, http.MethodPut, http.MethodTrace, "QUERY":
		return semconv.HTTPRequestMethodKey.String(method)
	}
	return semconv.HTTPRequestMethodOther
}

// httpErrorType is the error.type of an idemhttp answer: idem's class of
// the condition when the answer names one, else the status code of an
// error status (>= 400), as the semantic conventions for HTTP name an
// error; "" for a success.
func httpErrorType(e idemhttp.ResponseEvent) string {
	switch e.Problem {
	case idemhttp.ProblemKeyReused:
		return "fingerprint_mismatch"
	case idemhttp.ProblemInProgress:
		return "in_progress"
	case idemhttp.ProblemLeaseLost:
		return "lease_lost"
	case idemhttp.ProblemHandlerPanic:
		return "handler_panic"
	case idemhttp.ProblemUnavailable:
		return "store"
	}
	if e.Status >= 400 {
		return strconv.Itoa(e.Status)
	}
	if e.Status == 0 {
		// No response: a fail-open run, a client that left while
		// another attempt held the key, an attempt aborted or released.
		switch {
		case e.FailOpen:
			return "store"
		case e.Outcome == idem.InProgress:
			return "in_progress"
		case e.Outcome == idem.Failed:
			return "handler"
		}
	}
	return ""
}

func (o *Observer) leaseEvent(ctx context.Context, name string, e idem.LeaseEvent) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		kv := []attribute.KeyValue{AttemptKey.Int(e.Attempt), attribute.Int64("idem.token", e.Token)}
		if e.Op != "" {
			kv = append(kv, StoreOperationKey.String(e.Op))
		}
		span.AddEvent(name, trace.WithAttributes(kv...))
	}
}

// OnLeaseRenewed counts a renewal; implements idem.HookLeaseRenewed.
func (o *Observer) OnLeaseRenewed(ctx context.Context, e idem.LeaseEvent) {
	o.renewals.Add(ctx, 1, o.attrs(ctx, e.Consumer))
	o.leaseEvent(ctx, "idem.lease.renewed", e)
}

// OnLeaseTakenOver counts a takeover; implements idem.HookLeaseTakenOver.
func (o *Observer) OnLeaseTakenOver(ctx context.Context, e idem.LeaseEvent) {
	o.takeovers.Add(ctx, 1, o.attrs(ctx, e.Consumer))
	o.leaseEvent(ctx, "idem.lease.taken_over", e)
}

// OnLeaseLost counts a write rejected with ErrLeaseLost; implements
// idem.HookLeaseLost.
func (o *Observer) OnLeaseLost(ctx context.Context, e idem.LeaseEvent) {
	o.leaseLost.Add(ctx, 1, o.attrs(ctx, e.Consumer, StoreOperationKey.String(e.Op)))
	o.leaseEvent(ctx, "idem.lease.lost", e)
}

// OnPurge records a purge and its span; implements idem.HookPurge.
func (o *Observer) OnPurge(ctx context.Context, e idem.PurgeEvent) {
	result := "ok"
	switch {
	case errors.Is(e.Err, idem.ErrPurgeInProgress):
		result = "skipped"
	case e.Err != nil:
		result = "error"
	}
	res := o.attrs(ctx, e.Consumer, PurgeResultKey.String(result))
	o.purgeRuns.Add(ctx, 1, res)
	o.purgeDur.Record(ctx, e.Latency.Seconds(), res)
	if e.Err == nil {
		o.purgeRows.Add(ctx, e.Result.Deleted, o.attrs(ctx, e.Consumer))
		if !e.Result.Horizon.IsZero() {
			o.purgeLag.Record(ctx, e.Lag.Seconds(), o.attrs(ctx, e.Consumer))
		}
		if e.Span > 0 {
			o.purgeLoad.Record(ctx, e.Latency.Seconds()/e.Span.Seconds(), o.attrs(ctx, e.Consumer))
		}
	}
	end := time.Now()
	kv := []attribute.KeyValue{ConsumerKey.String(e.Consumer), PurgeResultKey.String(result),
		attribute.Int64("idem.purge.rows", e.Result.Deleted), attribute.Int("idem.purge.batches", e.Result.Batches)}
	_, span := o.tracer.Start(ctx, "purge "+e.Consumer, trace.WithTimestamp(end.Add(-e.Latency)), trace.WithAttributes(kv...))
	if result == "error" {
		span.RecordError(e.Err)
		span.SetStatus(codes.Error, "purge failed")
	}
	span.End(trace.WithTimestamp(end))
}

// OnStoreError counts a failed store call; implements idem.HookStoreError.
func (o *Observer) OnStoreError(ctx context.Context, e idem.StoreErrorEvent) {
	o.storeErrors.Add(ctx, 1, o.attrs(ctx, e.Consumer, ModeKey.String(e.Mode.String()), StoreOperationKey.String(e.Op)))
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent("idem.store.error", trace.WithAttributes(StoreOperationKey.String(e.Op), attribute.String("exception.message", e.Err.Error())))
	}
}

// statusName is the idem.status value of an outcome.
func statusName(o idem.Outcome) string {
	switch o.Status {
	case idem.Processed:
		return "processed"
	case idem.Duplicate:
		return "duplicate"
	case idem.InProgress:
		return "in_progress"
	case idem.FingerprintMismatch:
		return "fingerprint_mismatch"
	case idem.Failed:
		if o.Poison {
			return "poison"
		}
		return "failed"
	case idem.Rejected:
		return "rejected"
	}
	return "invalid"
}

// errorType is the error.type value of an error a consumer returned.
func errorType(err error) string {
	switch {
	case errors.Is(err, idem.ErrClosed):
		return "closed"
	case errors.Is(err, idem.ErrPoison):
		return "poison"
	case errors.Is(err, idem.ErrLeaseLost):
		return "lease_lost"
	case errors.Is(err, idem.ErrFingerprintMismatch):
		return "fingerprint_mismatch"
	case errors.Is(err, idem.ErrInProgress):
		return "in_progress"
	case errors.Is(err, idem.ErrMissingMessageID), errors.Is(err, idem.ErrInvalidMessageID), errors.Is(err, idem.ErrInvalidPayload):
		return "invalid_message"
	case errors.Is(err, idem.ErrHandlerPanic):
		return "handler_panic"
	case errors.Is(err, idem.ErrStore):
		return "store"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "canceled"
	}
	return "handler"
}

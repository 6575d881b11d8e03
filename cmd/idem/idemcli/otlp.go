package idemcli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemotel"
)

// otlpExport is OTLP/HTTP (protobuf) export of traces and metrics,
// configured by the standard OpenTelemetry environment variables:
//   - OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
//     OTEL_EXPORTER_OTLP_METRICS_ENDPOINT) turns it on; without any of
//     them nothing is exported. OTEL_EXPORTER_OTLP_HEADERS,
//     _TIMEOUT, _COMPRESSION, _CERTIFICATE and their per-signal forms are
//     read by the exporters.
//   - OTEL_TRACES_EXPORTER=none or OTEL_METRICS_EXPORTER=none turns one
//     signal off, OTEL_SDK_DISABLED=true both.
//   - OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES describe the
//     resource; service.name defaults to the command ("idem-proxy"), never
//     unknown_service.
//   - OTEL_METRIC_EXPORT_INTERVAL sets the metrics period (60s by default);
//     OTEL_BSP_* tune the span batcher.
//
// Only OTLP over HTTP with protobuf is built in
// (OTEL_EXPORTER_OTLP_PROTOCOL other than http/protobuf is refused).
type otlpExport struct {
	tp       *sdktrace.TracerProvider
	mp       *sdkmetric.MeterProvider
	observer *idemotel.Observer
}

// setupOTLP returns the export the environment asks for, or nil when it
// asks for none. The W3C trace-context propagator becomes the global one.
func setupOTLP(ctx context.Context, service string) (*otlpExport, error) {
	env := func(k string) string { return strings.TrimSpace(os.Getenv(k)) }
	if strings.EqualFold(env("OTEL_SDK_DISABLED"), "true") {
		return nil, nil
	}
	anyEndpoint := env("OTEL_EXPORTER_OTLP_ENDPOINT") != ""
	traces := (anyEndpoint || env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "") && env("OTEL_TRACES_EXPORTER") != "none"
	metrics := (anyEndpoint || env("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") != "") && env("OTEL_METRICS_EXPORTER") != "none"
	if !traces && !metrics {
		return nil, nil
	}
	for _, k := range []string{"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"} {
		if v := env(k); v != "" && v != "http/protobuf" {
			return nil, usageError{fmt.Errorf("%s=%s: only http/protobuf is built in", k, v)}
		}
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(service)), // the default; the environment wins
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return nil, fmt.Errorf("OTel resource: %w", err)
	}
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	e := &otlpExport{}
	if traces {
		exp, err := otlptracehttp.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("OTLP trace exporter: %w", err)
		}
		e.tp = sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	}
	if metrics {
		exp, err := otlpmetrichttp.New(ctx)
		if err != nil {
			_ = e.close(ctx)
			return nil, fmt.Errorf("OTLP metric exporter: %w", err)
		}
		e.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp)), sdkmetric.WithResource(res))
	}
	opts := []idemotel.Option{idemotel.WithTracerProvider(tracenoop.NewTracerProvider())}
	if e.tp != nil {
		opts[0] = idemotel.WithTracerProvider(e.tp)
	}
	if e.mp != nil {
		opts = append(opts, idemotel.WithMeterProvider(e.mp))
	} else {
		opts = append(opts, idemotel.WithMeterProvider(sdkmetric.NewMeterProvider())) // no reader: records nothing
	}
	if e.observer, err = idemotel.NewObserver(opts...); err != nil {
		_ = e.close(ctx)
		return nil, err
	}
	return e, nil
}

// hooks returns the Observer exporting over OTLP; nil on a nil export.
func (e *otlpExport) hooks() []idem.Hook {
	if e == nil {
		return nil
	}
	return []idem.Hook{e.observer}
}

// injector returns the HeaderInjector that sends the trace context
// upstream, nil when traces are not exported.
func (e *otlpExport) injector() idem.HeaderInjector {
	if e == nil || e.tp == nil {
		return nil
	}
	return idemotel.InjectTraceContext
}

// close flushes and shuts the providers down; a no-op on nil.
func (e *otlpExport) close(ctx context.Context) error {
	if e == nil {
		return nil
	}
	var errs []error
	if e.tp != nil {
		errs = append(errs, e.tp.Shutdown(ctx))
	}
	if e.mp != nil {
		errs = append(errs, e.mp.Shutdown(ctx))
	}
	return errors.Join(errs...)
}

var _ idemhttp.HookResponse = requestLogHook{}

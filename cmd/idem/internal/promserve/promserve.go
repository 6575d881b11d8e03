// Package promserve serves the Prometheus text format on GET /metrics for
// the idem commands that run consumers (idem demo, consume, proxy, relay):
// the idemotel metrics of the consumers given [Server.Hooks], exported
// through the OpenTelemetry Prometheus exporter, plus the Go runtime and
// process collectors, all on a private registry.
package promserve

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemotel"
)

// Server serves the Prometheus text format on GET /metrics: the idemotel
// metrics of the consumers that take [Server.Hooks], plus the Go runtime
// and process collectors, on a private registry (nothing is registered
// globally).
type Server struct {
	// Addr is the address the server listens on, with the port the kernel
	// chose when the flag asked for port 0.
	Addr string
	// MeterProvider is where a command creates instruments of its own; they
	// are served on the same /metrics.
	MeterProvider metric.MeterProvider
	// observer is the idem hook that records the consumer metrics.
	observer *idemotel.Observer

	mp   *sdkmetric.MeterProvider
	srv  *http.Server
	done chan struct{}
}

// Serve listens on addr (host:port; port 0 picks a free one) and
// serves /metrics until close. An empty addr is not allowed: callers only
// call it when the --metrics-addr flag is set. It returns an error when the
// address cannot be listened on or the exporter cannot be built.
func Serve(addr string) (*Server, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exp, err := otelprom.New(otelprom.WithRegisterer(reg),
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes))
	if err != nil {
		return nil, fmt.Errorf("metrics exporter: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	obs, err := idemotel.NewObserver(idemotel.WithMeterProvider(mp), idemotel.WithTracerProvider(tracenoop.NewTracerProvider()))
	if err != nil {
		_ = mp.Shutdown(context.Background())
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		_ = mp.Shutdown(context.Background())
		return nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	m := &Server{
		Addr: ln.Addr().String(), MeterProvider: mp, observer: obs, mp: mp,
		srv:  &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second},
		done: make(chan struct{}),
	}
	go func() {
		defer close(m.done)
		_ = m.srv.Serve(ln) // ErrServerClosed after close
	}()
	return m, nil
}

// Hooks returns the hooks to put in an idem.Config; nil on a nil server,
// so a command without --metrics-addr passes m.Hooks() unconditionally.
func (m *Server) Hooks() []idem.Hook {
	if m == nil {
		return nil
	}
	return []idem.Hook{m.observer}
}

// URL returns the address of the /metrics page.
func (m *Server) URL() string { return "http://" + m.Addr + "/metrics" }

// Close stops the server, waiting up to 5 seconds for scrapes in flight,
// and shuts the meter provider down. It is a no-op on a nil server.
func (m *Server) Close() error {
	if m == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := m.srv.Shutdown(ctx)
	<-m.done
	return errors.Join(err, m.mp.Shutdown(ctx))
}

package idemcli

import (
	"go.opentelemetry.io/otel/metric"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/promserve"
)

// metricsServer is the /metrics server of --metrics-addr (promserve.Server)
// under the names the commands use; a nil one serves nothing.
type metricsServer struct {
	srv *promserve.Server
	// meterProvider is where a command creates instruments of its own.
	meterProvider metric.MeterProvider
}

// serveMetrics serves /metrics on addr (promserve.Serve).
func serveMetrics(addr string) (*metricsServer, error) {
	s, err := promserve.Serve(addr)
	if err != nil {
		return nil, err
	}
	return &metricsServer{srv: s, meterProvider: s.MeterProvider}, nil
}

// hooks returns the hooks to put in an idem.Config; nil on a nil server.
func (m *metricsServer) hooks() []idem.Hook {
	if m == nil {
		return nil
	}
	return m.srv.Hooks()
}

// url returns the address of the /metrics page.
func (m *metricsServer) url() string { return m.srv.URL() }

// close stops the server; a no-op on a nil server.
func (m *metricsServer) close() error {
	if m == nil {
		return nil
	}
	return m.srv.Close()
}

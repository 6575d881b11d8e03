package idemcli

import (
	"testing"

	"github.com/idem-go/idem/cmd/idem/internal/promserve/promservetest"
)

// The metrics helpers of the command's tests.
var (
	scrape      = promservetest.Scrape
	value       = promservetest.Value
	expectValue = promservetest.ExpectValue
)

// A command without --metrics-addr runs with a nil metrics server.
func TestNilMetricsServer(t *testing.T) {
	t.Parallel()
	var m *metricsServer
	if err := m.close(); err != nil || m.hooks() != nil {
		t.Error("a nil metrics server is not a no-op")
	}
}

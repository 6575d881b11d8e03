package idemnats_test

import (
	"testing"

	"github.com/idem-go/idem/internal/testenv"
)

// TestExamplesOnServers runs the package's example that needs a server (go
// test only compiles it) and checks its output. Not parallel: it
// redirects os.Stdout.
func TestExamplesOnServers(t *testing.T) {
	testenv.RunServerExamples(t, testenv.NATSEnv,
		testenv.ServerExample{Name: "Example", Run: Example, Want: `invoice for order-1001: {"total":42}
`},
	)
}

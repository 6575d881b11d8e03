package idemamqp_test

import (
	"testing"

	"github.com/idem-go/idem/internal/testenv"
)

// TestExamplesOnServers runs the package's examples that need a server
// (they print what they do; go test only compiles them) and checks their
// output. Not parallel: it redirects os.Stdout.
func TestExamplesOnServers(t *testing.T) {
	testenv.RunServerExamples(t, testenv.AMQPEnv,
		testenv.ServerExample{Name: "Example", Run: Example, Want: `pay-1 {"amount":100}
pay-2 {"amount":100}
`},
	)
}

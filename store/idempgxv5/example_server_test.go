package idempgxv5_test

import (
	"testing"

	"github.com/idem-go/idem/internal/testenv"
)

// TestExamplesOnServers runs the package's examples that need a server
// (they print what they do; go test only compiles them) and checks their
// output. Not parallel: it redirects os.Stdout.
func TestExamplesOnServers(t *testing.T) {
	testenv.RunServerExamples(t, testenv.PostgresEnv,
		testenv.ServerExample{Name: "Example_leaseConsumer", Run: Example_leaseConsumer, Want: `Failed, attempt 1, result , error: mailer unavailable
Processed, attempt 2, result {"charge":"ch_42"}, error: <nil>
Duplicate, attempt 2, result {"charge":"ch_42"}, error: <nil>
charges: 1 calls: 1
record: completed after 2 attempts, last error "mailer unavailable"
`},
		testenv.ServerExample{Name: "Example", Run: Example, Want: `Processed ack: true error: false
Duplicate ack: true error: false
FingerprintMismatch ack: false error: true
orders: 1
`},
	)
}

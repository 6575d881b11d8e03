package riverexample_test

import (
	"testing"

	"github.com/idem-go/idem/internal/testenv"
)

// TestExamplesOnServers runs the example, which needs PostgreSQL (go test
// only compiles it), and checks what it prints. Not parallel: it redirects
// os.Stdout.
func TestExamplesOnServers(t *testing.T) {
	testenv.RunServerExamples(t, testenv.PostgresEnv,
		testenv.ServerExample{Name: "Example", Run: Example, Want: `jobs completed: 4
ledger rows: 1
charges: 1
`},
	)
}

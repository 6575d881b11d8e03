package idemredis_test

import (
	"testing"

	"github.com/idem-go/idem/internal/testenv"
)

// TestExamplesOnServers runs the package's examples that need a server
// (they print what they do; go test only compiles them) and checks their
// output. Not parallel: it redirects os.Stdout.
func TestExamplesOnServers(t *testing.T) {
	testenv.RunServerExamples(t, testenv.RedisEnv,
		testenv.ServerExample{Name: "Example", Run: Example, Want: `Failed attempt=1 result= ack=false error=true
Processed attempt=2 result={"charge":"ch_1"} ack=true error=false
Duplicate attempt=2 result={"charge":"ch_1"} ack=true error=false
FingerprintMismatch attempt=0 result= ack=false error=true
charges: 1 calls: 1
`},
	)
}

package scenariotest

import (
	"flag"
	"os"
	"testing"

	"github.com/idem-go/idem/internal/leakcheck"
)

// TestMain checks that no goroutine outlives the tests (renewal loops,
// purge loops, servers). The scenario tests spend most of their time
// waiting on leases and barriers, not on the CPU, so unless -test.parallel
// was given they run 8 at a time instead of GOMAXPROCS.
func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) {
		if f.Name == "test.parallel" {
			set = true
		}
	})
	if !set {
		_ = flag.Set("test.parallel", "8")
	}
	os.Exit(leakcheck.Run(m))
}

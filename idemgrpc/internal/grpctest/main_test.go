package grpctest

import (
	"os"
	"testing"

	"github.com/idem-go/idem/internal/leakcheck"
)

// TestMain checks that no goroutine outlives the tests (renewal loops,
// purge loops, gRPC servers and connections).
func TestMain(m *testing.M) { os.Exit(leakcheck.Run(m)) }

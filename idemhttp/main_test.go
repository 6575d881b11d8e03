package idemhttp

import (
	"os"
	"testing"

	"github.com/idem-go/idem/internal/leakcheck"
)

// TestMain checks that no goroutine outlives the tests (servers, renewal
// and purge loops).
func TestMain(m *testing.M) { os.Exit(leakcheck.Run(m)) }

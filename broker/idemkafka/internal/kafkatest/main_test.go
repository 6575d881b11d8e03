package kafkatest

import (
	"os"
	"testing"

	"github.com/idem-go/idem/internal/leakcheck"
)

// TestMain fails the run if a test leaves a goroutine behind (a Consumer
// loop, a worker, a timer, a client) once the tests are over.
func TestMain(m *testing.M) { os.Exit(leakcheck.Run(m)) }

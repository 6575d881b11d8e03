package riverexample

import (
	"os"
	"testing"

	"github.com/idem-go/idem/internal/leakcheck"
)

func TestMain(m *testing.M) { os.Exit(leakcheck.Run(m)) }

package failovertest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// natsServerCurrent is the nats-server release TestNATSCurrentStreamLeaderFailover
// builds from the Go module proxy: the newest the proxy served when the row
// was added (Debian's package, which TestNATSStreamLeaderFailover runs, is
// 2.9.10).
const natsServerCurrent = "v2.15.3"

// TestNATSCurrentStreamLeaderFailover is TestNATSStreamLeaderFailover on
// the current nats-server release (natsServerCurrent) rather than
// Debian's: built with `go install` into a directory of the test's own
// (or the binary named by IDEM_NATS_SERVER_BIN, as it is), and run by
// scripts/services through IDEM_NATS_HA_BIN. It makes reducedRounds
// failovers.
func TestNATSCurrentStreamLeaderFailover(t *testing.T) {
	t.Parallel()
	bin := os.Getenv("IDEM_NATS_SERVER_BIN")
	// Without root ownservice skips (or fails, under
	// IDEM_TEST_REQUIRE_ALL=1) before the binary is used: no build then.
	if bin == "" && os.Geteuid() == 0 {
		bin = buildNATSServer(t, natsServerCurrent)
	}
	testNATSStreamLeaderFailover(t, reducedRounds(t), "IDEM_NATS_HA_BIN="+bin)
}

// buildNATSServer builds github.com/nats-io/nats-server/v2 at version
// into a temporary directory, outside this workspace (GOWORK=off: go
// install of a module at a version uses that module's own go.mod), and
// returns the binary's path.
func buildNATSServer(t *testing.T, version string) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.CommandContext(t.Context(), "go", "install", "github.com/nats-io/nats-server/v2@"+version)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOWORK=off", "GOFLAGS=", "CGO_ENABLED=0")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("go install nats-server %s: %v\n%s", version, err, out.String())
	}
	return filepath.Join(dir, "nats-server")
}

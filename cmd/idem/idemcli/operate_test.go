package idemcli

import (
	"path/filepath"
	"strings"
	"testing"
)

// The operator commands run through the idem command: exit statuses,
// flags from the environment, and no password in any output.
func TestOperateCommands(t *testing.T) {
	db := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	if code, _, stderr := run(t, "migrate", "--store", db); code != 0 {
		t.Fatalf("migrate: %d %s", code, stderr)
	}
	if code, stdout, stderr := run(t, "failed", "--store", db, "--consumer", "c"); code != 1 || !strings.Contains(stderr, `unknown consumer "c"`) {
		t.Errorf("failed of an unknown consumer: %d %q %q", code, stdout, stderr)
	}
	if code, _, stderr := run(t, "replay", "--store", db, "--consumer", "c", "--dead-letter", "d", "--position", "1"); code != 2 || !strings.Contains(stderr, "--broker") {
		t.Errorf("replay without --broker: %d %q", code, stderr)
	}
	if code, _, stderr := run(t, "retry", "--store", db, "--consumer", "c", "--id", "m"); code != 1 || !strings.Contains(stderr, "nothing changed") {
		t.Errorf("retry of a missing record: %d %q", code, stderr)
	}
	if code, _, stderr := run(t, "release", "--store", db, "--consumer", "c"); code != 2 || !strings.Contains(stderr, "--id") {
		t.Errorf("release without --id: %d %q", code, stderr)
	}
	if code, _, stderr := run(t, "console", "--store", db, "--addr", "0.0.0.0:0"); code != 2 || !strings.Contains(stderr, "without a token") {
		t.Errorf("console beyond loopback without a token: %d %q", code, stderr)
	}
	pw := "pw-hunter2-xyz"
	code, stdout, stderr := run(t, "failed", "--store", "postgres://idem:"+pw+"@127.0.0.1:1/x?connect_timeout=1", "--consumer", "c")
	if code != 1 || strings.Contains(stdout+stderr, pw) {
		t.Errorf("unreachable store: %d, output %q %q (must not hold the password)", code, stdout, stderr)
	}
}

package idemcli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMissingTableNamesTable: a command pointed at a database without the
// records table (a demo's store without --table idem_demo_processed) says
// that --table may be wrong, once, on its one line, and exits 1.
func TestMissingTableNamesTable(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "empty.db")
	if err := os.WriteFile(db, nil, 0o600); err != nil { // an empty file is an empty SQLite database
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"stats", "--store", "sqlite:" + db},
		{"failed", "--store", "sqlite:" + db, "--consumer", "payments"},
		{"inspect", "--store", "sqlite:" + db, "--consumer", "payments", "--id", "pay-1"},
	} {
		code, _, errOut := run(t, args...)
		if code != 1 || strings.Count(errOut, "is --table right?") != 1 || !strings.Contains(errOut, "idem_demo_processed") {
			t.Errorf("%v: exit %d, stderr %q; want 1 and the --table hint once", args, code, errOut)
		}
		if n := strings.Count(strings.TrimSpace(errOut), "\n"); n != 0 {
			t.Errorf("%v: stderr has %d lines, want one: %q", args, n+1, errOut)
		}
	}
	if got := missingTableHint(os.ErrNotExist); got != "" {
		t.Errorf("hint for an unrelated error: %q, want none", got)
	}
}

package idemcli

// The helpers and tests of the command that hold with or without the demo
// (a build with the nodemo tag).

import (
	"bytes"
	"strings"
	"testing"

	"github.com/idem-go/idem/cmd/idem/internal/clitest"
)

// run runs the command in process and returns its exit status and output.
func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = Main(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestErrorsAreOneLineWithExitStatus(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"unknown flag", []string{"demo", "--nope"}, 2, "unknown flag"},
		{"misspelt flag", []string{"stats", "--stroe", "sqlite:x.db"}, 2, "unknown flag: --stroe (idem stats --help lists its flags)"},
		{"flag without its value", []string{"purge", "--older-than"}, 2, "flag needs an argument: --older-than (idem purge --help lists its flags)"},
		{"bad fraction", []string{"demo", "--duplicates", "2"}, 2, "--duplicates"},
		{"bad store scheme", []string{"stats", "--store", "oracle://x"}, 1, "unknown scheme"},
		{"missing store", []string{"stats"}, 2, "--store is required"},
		{"unreachable postgres", []string{"stats", "--store", "postgres://u:secret@127.0.0.1:1/db?connect_timeout=2"}, 1, "cannot reach postgres at 127.0.0.1:1"},
		{"unknown command", []string{"frobnicate"}, 2, "unknown command"},
		{"password in an unparsable URL", []string{"stats", "--store", "postgres://idem:secret@127.0.0.1:abc/db"}, 1, "xxxxx"},
		{"missing sqlite file", []string{"stats", "--store", "sqlite:/nonexistent/idem.db"}, 1, "run idem migrate"},
		{"zero timeout", []string{"demo", "--timeout", "0"}, 2, "--timeout"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if tt.args[0] == "demo" && !demoBuilt() {
				// A build with the nodemo tag has no demo command.
				tt.code, tt.want = 2, `unknown command "demo"`
			}
			code, _, errOut := run(t, tt.args...)
			if code != tt.code {
				t.Errorf("exit %d, want %d (stderr %q)", code, tt.code, errOut)
			}
			if !strings.Contains(errOut, tt.want) {
				t.Errorf("stderr %q lacks %q", errOut, tt.want)
			}
			if n := strings.Count(strings.TrimSpace(errOut), "\n"); n != 0 {
				t.Errorf("stderr has %d lines, want one: %q", n+1, errOut)
			}
			if strings.Contains(errOut, "secret") || strings.Contains(errOut, "goroutine") || strings.Contains(errOut, "idem: idem:") {
				t.Errorf("stderr leaks a password or a stack: %q", errOut)
			}
		})
	}
}

func TestFlagsFromEnvironment(t *testing.T) {
	t.Setenv("IDEM_STORE", "oracle://from-env")
	code, _, errOut := run(t, "stats")
	if code != 1 || !strings.Contains(errOut, "oracle://from-env") {
		t.Errorf("IDEM_STORE not read: exit %d, %q", code, errOut)
	}
}

// optionalURL returns the URL in the environment variable env, or ""; under
// IDEM_TEST_REQUIRE_ALL=1 (the README test command) a missing URL fails
// the test.
func optionalURL(t *testing.T, env string) string { return clitest.OptionalURL(t, env) }

// serviceURL is optionalURL, skipping the test when the URL is missing.
func serviceURL(t *testing.T, env string) string {
	t.Helper()
	u := optionalURL(t, env)
	if u == "" {
		t.Skipf("%s is not set", env)
	}
	return u
}

// freePorts returns n distinct loopback ports that were free a moment ago.
func freePorts(t *testing.T, n int) []int { return clitest.FreePorts(t, n) }

// demoBuilt reports whether this build has the demo command (not built
// with the nodemo tag).
func demoBuilt() bool {
	for _, c := range extraCommands {
		if c().Name() == "demo" {
			return true
		}
	}
	return false
}

package idemcli

import (
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestUnreachableRedisIsOneLine: a Redis store or broker that refuses
// connections makes the command print its one error line, without
// go-redis's own "connection pool: failed to dial" lines (one for each
// retry of the first ping, logged through its package-level logger). It
// runs the command in a child process, as Main runs it: with the
// process's stderr, where the drivers' lines go.
func TestUnreachableRedisIsOneLine(t *testing.T) {
	if args := os.Getenv("IDEM_TEST_MAIN_ARGS"); args != "" {
		os.Exit(Main(strings.Split(args, "\n"), os.Stdout, os.Stderr))
	}
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := ln.Addr().String() // nobody listens there once closed
	ln.Close()
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"store", []string{"proxy", "--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:9", "--store", "redis://:pw@" + refused + "/0"}, "idem: cannot reach redis at " + refused + ": "},
		{"cluster store", []string{"proxy", "--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:9", "--store", "redis-cluster://" + refused}, "idem: cannot reach redis cluster at " + refused + ": "},
		{"broker", []string{"publish", "--broker", "redis://" + refused + "/0", "--to", "s", "--count", "1"}, "idem: cannot reach Redis at " + refused + ": "},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestUnreachableRedisIsOneLine$")
			cmd.Env = append(os.Environ(), "IDEM_TEST_MAIN_ARGS="+strings.Join(tt.args, "\n"))
			var stderr strings.Builder
			cmd.Stderr = &stderr
			err := cmd.Run()
			if exit, ok := err.(*exec.ExitError); !ok || exit.ExitCode() != 1 {
				t.Errorf("exit: %v, want status 1", err)
			}
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			if len(lines) != 1 || !strings.HasPrefix(lines[0], tt.want) {
				t.Errorf("stderr, want one line starting %q:\n%s", tt.want, stderr.String())
			}
		})
	}
}

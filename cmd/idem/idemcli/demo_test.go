//go:build !nodemo

package idemcli

import (
	"context"
	"strings"
	"testing"
)

// TestDemoWithPasswordOnNATS runs the demo to its report on a NATS server
// that requires a user and a password with '/', '@', ':', '%', '#' and
// '?', written raw in the URL: the command connects with the password the
// operator meant and prints it nowhere.
func TestDemoWithPasswordOnNATS(t *testing.T) {
	t.Parallel()
	for _, pw := range []struct{ name, written, meant string }{secretPasswords[4], secretPasswords[5]} {
		t.Run(pw.name, func(t *testing.T) {
			t.Parallel()
			addr := startNATS(t, "demo", pw.meant)
			code, output := runMain(context.Background(), "demo", "--broker", "nats://demo:"+pw.written+"@"+addr,
				"--messages", "40", "--consumers", "2", "--crash-rate", "0", "--progress", "none", "--timeout", "2m")
			if code != 0 || !strings.Contains(output, "nats://demo:xxxxx@"+addr) || !strings.Contains(output, "lost messages") {
				t.Fatalf("exit %d, want 0 and a report naming the broker without its password:\n%s", code, output)
			}
			wantNoPassword(t, output, pw.written, pw.meant)
			// The wrong password is refused, and not printed either.
			code, output = runMain(context.Background(), "demo", "--broker", "nats://demo:Wrong/pw%40"+"@"+addr,
				"--messages", "1", "--progress", "none", "--timeout", "1m")
			if code != 1 || !strings.Contains(output, "cannot reach NATS at nats://demo:xxxxx@"+addr) {
				t.Fatalf("wrong password: exit %d:\n%s", code, output)
			}
			wantNoPassword(t, output, "Wrong/pw%40", "Wrong/pw@")
		})
	}
}

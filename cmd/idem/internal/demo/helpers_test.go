//go:build !nodemo

package demo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/spf13/pflag"

	"github.com/idem-go/idem/cmd/idem/internal/clitest"
	"github.com/idem-go/idem/cmd/idem/internal/promserve/promservetest"
	"github.com/idem-go/idem/internal/testenv"
)

// runArgs runs the demo with args as they follow `idem` on the command
// line ("demo" and its flags) until ctx ends
// and returns the idem command's exit status for its outcome: 0, 1 on an
// error, 2 on a bad flag, 3 when a payment was not charged exactly once.
func runArgs(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "demo" {
		fmt.Fprintf(stderr, "idem: want demo and its flags, got %q\n", args)
		return 2
	}
	args = args[1:]
	o := &Options{}
	fs := pflag.NewFlagSet("demo", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		fmt.Fprintf(stderr, "idem: %v\n", err)
		return 2
	}
	err := Run(ctx, o, stdout, stderr)
	if err == nil {
		return 0
	}
	fmt.Fprintf(stderr, "idem: %v\n", err)
	var ue UsageError
	switch {
	case errors.As(err, &ue):
		return 2
	case errors.Is(err, ErrNotExactlyOnce):
		return 3
	}
	return 1
}

// run runs the demo with args (starting with "demo") in process.
func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = runArgs(t.Context(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// serviceURL is the URL of a service from the environment, skipping the
// test when it is not set (failing it under IDEM_TEST_REQUIRE_ALL=1).
func serviceURL(t *testing.T, env string) string {
	t.Helper()
	return testenv.URL(t, env, "the URL ./scripts/services prints")
}

// The service helpers the command's tests share.
var (
	optionalURL = clitest.OptionalURL
	storeURLs   = clitest.StoreURLs
	freePorts   = clitest.FreePorts
)

// The metrics helpers.
var (
	scrape      = promservetest.Scrape
	value       = promservetest.Value
	expectValue = promservetest.ExpectValue
)

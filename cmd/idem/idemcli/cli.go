// Package idemcli is the idem command: `idem demo` runs the Idempotent
// Consumer pattern end to end on real parts (an in-process NATS JetStream
// server and SQLite by default), and migrate, purge, inspect and stats
// operate idem's tables in production.
//
// The package is importable so the commands are tested in process: [Main]
// takes the arguments and the output streams and returns the exit status.
// Every flag can also be set from an environment variable named IDEM_ and
// the flag name in upper case with dashes as underscores (--store is
// IDEM_STORE); a flag given on the command line wins.
package idemcli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// exitError carries an exit status other than 1 out of a command.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// Main runs the idem command with args (without the program name), writing
// results to stdout and diagnostics to stderr, and returns the process exit
// status: 0 on success, 1 on an error (printed as one line, never a stack
// trace), 2 on a usage error, and 3 when `idem demo` finished but found
// double charges or lost messages.
func Main(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := newRoot(stdout, stderr)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	fmt.Fprintf(stderr, "idem: %s\n", strings.TrimPrefix(oneLine(err), "idem: "))
	var ee *exitError
	switch {
	case errors.As(err, &ee):
		return ee.code
	case isUsageError(err):
		return 2
	}
	return 1
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "idem",
		Short: "Make message consumers and HTTP APIs safe to repeat",
		Long: `idem runs the Idempotent Consumer pattern end to end and operates its tables.

Every flag can also be set with an environment variable: IDEM_ followed by the
flag name in upper case, dashes as underscores (--store is IDEM_STORE).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return flagsFromEnv(cmd)
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(newDemoCmd(), newMigrateCmd(), newPurgeCmd(), newInspectCmd(), newStatsCmd(), newProxyCmd(), newRelayCmd())
	return root
}

// usageError marks bad flags or arguments (exit status 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func isUsageError(err error) bool {
	var ue usageError
	if errors.As(err, &ue) {
		return true
	}
	msg := err.Error()
	return strings.HasPrefix(msg, "unknown command") || strings.HasPrefix(msg, "accepts ") ||
		strings.HasPrefix(msg, "required flag")
}

// flagsFromEnv sets every flag not given on the command line from its
// IDEM_* environment variable.
func flagsFromEnv(cmd *cobra.Command) error {
	var err error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed || f.Name == "help" {
			return
		}
		env := "IDEM_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(env); ok {
			if e := cmd.Flags().Set(f.Name, v); e != nil {
				err = usageError{fmt.Errorf("%s=%q: %w", env, v, e)}
			}
		}
	})
	return err
}

// oneLine flattens an error (errors.Join uses newlines) to one line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " ")
}

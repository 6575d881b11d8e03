// Package idemcli is the idem command: `idem demo` runs the Idempotent
// Consumer pattern end to end on real parts (an in-process NATS JetStream
// server and SQLite by default), and migrate, purge, inspect and stats
// operate idem's tables in production (inspect and stats also print JSON
// with --json); proxy serves the idempotency-key middleware in front of any
// HTTP service, logging one line per request and exporting OTLP traces and
// metrics when the standard OTEL_* variables ask for it; version prints the
// module version and VCS revision from the build information.
//
// A binary without the demo, which does not link the demo's embedded NATS
// server and kfake, is built with the nodemo tag:
//
//	go build -tags nodemo ./cmd/idem   # about 62 MB instead of 80 MB
//
// The package is importable so the commands are tested in process: [Main]
// takes the arguments and the output streams and returns the exit status.
// Every flag can also be set from an environment variable named IDEM_ and
// the flag name in upper case with dashes as underscores (--store is
// IDEM_STORE); a flag given on the command line wins.
//
// No secret is printed: everything the commands write to stdout and stderr
// (messages, reports, logs, third-party errors) passes through a
// secret.Set holding the passwords of the URLs given in the arguments and
// the IDEM_* environment and the values of secret flags (--scope-secret),
// which masks them in every form, and the password of any other URL.
package idemcli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/idem-go/idem/cmd/idem/internal/connect"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/cmd/idem/internal/secret"
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
	return mainContext(ctx, args, stdout, stderr)
}

// mainContext is Main until ctx ends (a signal, for Main). The log lines
// of the drivers' package-level loggers go to stderr (masked too) when it
// is a file, the process's stderr; otherwise (a command run in process,
// as tests do, side by side) they are dropped.
func mainContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	sec := &secret.Set{}
	root := newRootSecrets(sec, stdout, stderr)
	secretsFromArgs(root, sec, args)
	if _, ok := stderr.(*os.File); ok {
		routeLibraryLogs(root.ErrOrStderr())
	}
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	fmt.Fprintf(root.ErrOrStderr(), "idem: %s%s\n", strings.TrimPrefix(oneLine(err), "idem: "), missingTableHint(err))
	var ee *exitError
	switch {
	case errors.As(err, &ee):
		return ee.code
	case isUsageError(err):
		return 2
	}
	return 1
}

// newRoot is the idem command writing to stdout and stderr, with secrets
// masked in both.
func newRoot(stdout, stderr io.Writer) *cobra.Command {
	return newRootSecrets(&secret.Set{}, stdout, stderr)
}

// newRootSecrets is newRoot with the secrets in sec masked too. Before a
// command runs, the secrets in its flags are added to sec and its URL
// flags normalized (secret.Normalize).
func newRootSecrets(sec *secret.Set, stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "idem",
		Short: "Make message consumers and HTTP APIs safe to repeat",
		Long: `idem runs the Idempotent Consumer pattern end to end and operates its tables.

Every flag can also be set with an environment variable: IDEM_ followed by the
flag name in upper case, dashes as underscores (--store is IDEM_STORE).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := flagsFromEnv(cmd); err != nil {
				return err
			}
			return secretsFromFlags(cmd, sec)
		},
	}
	root.SetOut(sec.Writer(stdout))
	root.SetErr(sec.Writer(stderr))
	routeLibraryLogs(nil)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		// pflag says which flag is wrong, not where the right ones are.
		return usageError{fmt.Errorf("%w (%s --help lists its flags)", err, cmd.CommandPath())}
	})
	root.AddCommand(newMigrateCmd(), newPurgeCmd(), newInspectCmd(), newStatsCmd(), newProxyCmd(), newConsumeCmd(), newPublishCmd(), newRelayCmd(), newVersionCmd())
	for _, extra := range extraCommands {
		root.AddCommand(extra())
	}
	return root
}

// extraCommands are the commands of optional parts of the binary, added by
// their files' init (the demo, left out of a build with the nodemo tag).
var extraCommands []func() *cobra.Command

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

// secretAnnotation marks a flag whose whole value is a secret (a key):
// its value is masked in every output.
const secretAnnotation = "idem_secret"

// markSecret marks the flag name of cmd as a secret.
func markSecret(cmd *cobra.Command, name string) {
	_ = cmd.Flags().SetAnnotation(name, secretAnnotation, []string{"true"})
}

// urlFlags are the flags that take a store or broker URL (or DSN), which
// secretsFromFlags normalizes.
var urlFlags = []string{"store", "broker", "upstream"}

// secretsFromArgs adds to sec, before the flags are parsed (whose errors
// may repeat a value), the passwords of the URLs in args and in the IDEM_*
// environment, and the values given to secret flags there.
func secretsFromArgs(root *cobra.Command, sec *secret.Set, args []string) {
	sec.AddText(args...)
	secretFlags := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if f.Annotations[secretAnnotation] != nil {
				secretFlags[f.Name] = true
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	for i, a := range args {
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || !secretFlags[name] {
			continue
		}
		if hasValue {
			sec.AddSecret(value)
		} else if i+1 < len(args) {
			sec.AddSecret(args[i+1])
		}
	}
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(k, "IDEM_") {
			continue
		}
		sec.AddText(v)
		if secretFlags[strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(k, "IDEM_"), "_", "-"))] {
			sec.AddSecret(v)
		}
	}
}

// secretsFromFlags adds the secrets in cmd's parsed flags to sec: the
// passwords of URLs in any flag and the values of secret flags. It
// normalizes the URL flags so that drivers read the password the
// operator meant (secret.Normalize).
func secretsFromFlags(cmd *cobra.Command, sec *secret.Set) error {
	var err error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		v := f.Value.String()
		if f.Annotations[secretAnnotation] != nil {
			sec.AddSecret(v)
			return
		}
		sec.AddText(v)
		if slices.Contains(urlFlags, f.Name) {
			if n := secret.Normalize(v); n != v {
				if e := f.Value.Set(n); e != nil && err == nil {
					err = usageError{fmt.Errorf("--%s: %w", f.Name, e)}
				}
			}
		}
	})
	return err
}

// libraryLogs is where the drivers that log through package-level loggers
// (go-redis, go-sql-driver/mysql) write: Main's scrubbed stderr, or
// nowhere. Never the process's stderr unmasked.
var libraryLogs struct {
	once sync.Once
	mu   sync.Mutex
	w    io.Writer
}

// routeLibraryLogs takes the drivers' own loggers over, so their lines
// never reach the process's stderr unmasked, and sends the lines to w
// when w is not nil (dropped until then).
func routeLibraryLogs(w io.Writer) {
	if w != nil {
		libraryLogs.mu.Lock()
		libraryLogs.w = w
		libraryLogs.mu.Unlock()
	}
	libraryLogs.once.Do(func() {
		redis.SetLogger(libraryLogger{})
		_ = mysql.SetLogger(libraryLogger{})
	})
}

// libraryLogger writes a driver's log line to libraryLogs.w in one write.
type libraryLogger struct{}

func (libraryLogger) Printf(_ context.Context, format string, v ...any) {
	libraryLogger{}.write(fmt.Sprintf(format, v...))
}

func (libraryLogger) Print(v ...any) { libraryLogger{}.write("mysql: " + fmt.Sprint(v...)) }

func (libraryLogger) write(line string) {
	if connect.DriverLogsQuiet() {
		return // a first ping's retries: its error says the same
	}
	libraryLogs.mu.Lock()
	defer libraryLogs.mu.Unlock()
	if libraryLogs.w != nil {
		_, _ = io.WriteString(libraryLogs.w, strings.TrimRight(line, "\n")+"\n")
	}
}

// oneLine flattens an error (errors.Join uses newlines) to one line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " ")
}

// missingTableHint is what follows an error from a records table that does
// not exist (SQLite's "no such table", PostgreSQL's SQLSTATE 42P01, MySQL's
// error 1146): the likely cause is a wrong --table, as on a demo's store,
// whose table is idem_demo_processed. It is empty for any other error, and
// for one that already says so.
func missingTableHint(err error) string {
	text := err.Error()
	if strings.Contains(text, "is --table right?") {
		return ""
	}
	for _, missing := range []string{"no such table", "(SQLSTATE 42P01)", "Error 1146"} {
		if strings.Contains(text, missing) {
			return " " + console.MissingTableHint
		}
	}
	return ""
}

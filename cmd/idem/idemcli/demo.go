//go:build !nodemo

package idemcli

import (
	"errors"

	"github.com/spf13/cobra"

	"github.com/idem-go/idem/cmd/idem/internal/demo"
)

// The demo is part of the default build; `go build -tags nodemo` leaves it
// out, and with it the embedded NATS server and kfake it links.
func init() { extraCommands = append(extraCommands, newDemoCmd) }

// newDemoCmd is `idem demo`: its flags, then one call into package demo.
func newDemoCmd() *cobra.Command {
	o := &demo.Options{}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Charge payments exactly once through redeliveries, duplicates and crashes",
		Long: `demo runs the Idempotent Consumer pattern end to end on real parts.

A producer publishes PaymentRequested messages with the payment ID as the
message ID (a business key: a producer that restarts publishes the same IDs
again). Payments consumers, run by idem's broker adapters, charge each one
through idem: a ledger row written in the same transaction as the
processed-message record, and a call to a fake payment provider (its own
database, outside that transaction) with an idempotency key derived from the
message ID. Redelivery happens for real: the producer
publishes a fraction of the messages twice (--duplicates), consumers die
(close their connection) after the provider call or after the commit, before
the ack (--crash-rate), new ones take over, and unacked messages come back.
Messages that can never be processed would go to a dead letter, counted in
the report.

A broker or store restart does not end the run: the producer publishes again
with the same message IDs, the consumers reconnect, and the report follows.

By default everything runs in process: a NATS JetStream server with file
storage and SQLite, in a temporary folder removed at the end. With --dir the
folder is kept, and a second run on it resumes where the first stopped.

The report explains each counter and ends with a verdict line; --json prints
it as one object with the settings and "ok".

--without-idem runs the same story (same seed, same duplicates, the same
crash rate) through a naive consumer: it acknowledges each message on
receipt and charges it afterwards from a worker queue, keeps no
processed-message record and sends the provider a new key on every attempt.
Its report shows the double charges (every delivery charges) and the lost
payments (acknowledged, then dropped by a crash before the ledger commit)
that idem prevents. Run it, then the plain demo, to see the problem and then
the fix.

--console keeps a web console (the one idem console serves) up on the
demo's store after the report, on 127.0.0.1:8089 (--console-addr), until
interrupted: first it stages work for an operator to look at under a
consumer of its own, idem-demo-refunds (refunds that failed for good, one
whose lease is held, outbox rows whose publish failed for good), which the
report does not count. Its address is printed on stderr.

The exit status is 0 only when every payment was charged exactly once: no
double charges and no lost messages (3 otherwise). With --without-idem it is
0 whenever the run completed: it is a demonstration.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return demoError(demo.Run(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr()))
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

// demoError gives the demo's errors the idem command's exit statuses: 2
// for a bad setting, 3 for a run that found double or lost charges.
func demoError(err error) error {
	var ue demo.UsageError
	switch {
	case errors.As(err, &ue):
		return usageError{err}
	case errors.Is(err, demo.ErrNotExactlyOnce):
		return &exitError{code: 3, err: err}
	}
	return err
}

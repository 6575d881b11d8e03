package idemcli

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/spf13/cobra"
)

// printOutboxStats prints the outbox backlog of store: rows pending,
// failed for good, and the age of the oldest pending row (the relay lag).
// A store whose outbox table is missing (migrated before the outbox) gets
// a note on stderr, not an error: the records' stats stand on their own.
func printOutboxStats(cmd *cobra.Command, store idemdriver.OutboxStore) error {
	s, err := store.OutboxStats(cmd.Context())
	if err != nil {
		fmt.Fprintf(cmd.ErrOrStderr(), "outbox: no backlog to show (%v); `idem migrate` creates the outbox table\n", err)
		return nil
	}
	tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\nOUTBOX\tPENDING\tFAILED\tOLDEST PENDING")
	fmt.Fprintf(tw, "outbox\t%d\t%d\t%s\n", s.Pending, s.Failed, s.OldestPending.Round(time.Millisecond))
	return tw.Flush()
}

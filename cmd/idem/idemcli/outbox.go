package idemcli

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/spf13/cobra"
)

// outboxStats reads the outbox backlog of store. A store whose outbox
// table is missing (migrated before the outbox) gets a note on stderr and
// nil, not an error: the records' stats stand on their own.
func outboxStats(cmd *cobra.Command, store idemdriver.OutboxStore) *idemdriver.OutboxStats {
	s, err := store.OutboxStats(cmd.Context())
	if err != nil {
		fmt.Fprintf(cmd.ErrOrStderr(), "outbox: no backlog to show (%v); `idem migrate` creates the outbox table\n", err)
		return nil
	}
	return &s
}

// printOutboxStats prints the outbox backlog s: rows pending, failed for
// good, and the age of the oldest pending row (the relay lag); nothing
// when s is nil.
func printOutboxStats(cmd *cobra.Command, s *idemdriver.OutboxStats) error {
	if s == nil {
		return nil
	}
	tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\nOUTBOX\tPENDING\tFAILED\tOLDEST PENDING")
	fmt.Fprintf(tw, "outbox\t%d\t%d\t%s\n", s.Pending, s.Failed, s.OldestPending.Round(time.Millisecond))
	return tw.Flush()
}

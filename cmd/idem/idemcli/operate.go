package idemcli

import (
	"context"
	"errors"

	"github.com/spf13/cobra"

	"github.com/idem-go/idem/cmd/idem/internal/operate"
)

// The operator commands (failed, retry, release, console) live in
// internal/operate; this registers them over the SQL stores.
func init() {
	for i := range operate.Commands(openOperated, nil) {
		extraCommands = append(extraCommands, func() *cobra.Command { return adaptOperate(operate.Commands(openOperated, nil)[i]) })
	}
}

// openOperated opens a SQL store for the operator commands.
func openOperated(ctx context.Context, storeURL, table string) (operate.Opened, error) {
	st, err := (&storeFlags{store: storeURL, table: table}).openExisting(ctx)
	if err != nil {
		return operate.Opened{}, err
	}
	return operate.Opened{Store: st.store, Where: st.where, Close: st.db.Close}, nil
}

// adaptOperate makes the command's usage errors the idem command's (exit
// status 2) and marks its token flag secret.
func adaptOperate(c *cobra.Command) *cobra.Command {
	run := c.RunE
	c.RunE = func(cmd *cobra.Command, args []string) error {
		err := run(cmd, args)
		var ue operate.UsageError
		if errors.As(err, &ue) {
			return usageError{err}
		}
		return err
	}
	if c.Flags().Lookup("token") != nil && c.Name() == "console" {
		markSecret(c, "token")
	}
	return c
}

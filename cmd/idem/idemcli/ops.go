package idemcli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/idemdriver"
)

// storeFlags are the flags every operating command takes.
type storeFlags struct {
	store string
	table string
}

func (s *storeFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&s.store, "store", "", "store URL: sqlite:PATH, postgres://..., mysql://... (required)")
	cmd.Flags().StringVar(&s.table, "table", "", "processed-messages table (default idem_processed)")
}

func (s *storeFlags) check() error {
	if s.store == "" {
		return usageError{errors.New("--store is required (or IDEM_STORE)")}
	}
	return nil
}

// mustExist refuses a SQLite store file that does not exist (opening it
// would create an empty database): only migrate creates one.
func (s *storeFlags) mustExist() error {
	scheme, rest, _ := strings.Cut(s.store, ":")
	if scheme != "sqlite" && scheme != "sqlite3" {
		return nil
	}
	path := strings.TrimPrefix(rest, "//")
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("sqlite file %s does not exist (run idem migrate --store %s first)", path, s.store)
	}
	return nil
}

// openExisting opens the store of the flags after check and mustExist.
func (s *storeFlags) openExisting(ctx context.Context) (*sqlStore, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if err := s.mustExist(); err != nil {
		return nil, err
	}
	return openSQLStore(ctx, s.store, s.table)
}

func newMigrateCmd() *cobra.Command {
	var sf storeFlags
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or upgrade idem's tables",
		Long: `migrate applies idem's embedded schema migrations to the store. It is idempotent
and safe to run from several processes at once, and while consumers run: on
PostgreSQL, indexes are built concurrently, and a statement that needs the table's
exclusive lock waits at most a second for it (then gives way and tries again), so
no consumer waits behind it for longer. Upgrade the tables, then the binaries.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := sf.check(); err != nil {
				return err
			}
			st, err := openSQLStore(cmd.Context(), sf.store, sf.table)
			if err != nil {
				return err
			}
			defer st.db.Close()
			if err := st.store.Migrate(cmd.Context()); err != nil {
				return fmt.Errorf("migrate %s: %w", st.where, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "migrated %s\n", st.where)
			return nil
		},
	}
	sf.add(cmd)
	return cmd
}

func newPurgeCmd() *cobra.Command {
	var (
		sf        storeFlags
		consumer  string
		olderThan time.Duration
		batch     int
		dryRun    bool
		duty      float64
	)
	cmd := &cobra.Command{
		Use:   "purge",
		Short: "Delete a consumer's processed records outside the retention window",
		Long: `purge deletes the consumer's processed-message records that the consumer
has outrun by --older-than of running time: time in which the consumer was
not running does not count, so a consumer that was down keeps the history
its redeliveries need. Deletes in batches, one cleaner at a time; the
consumer need not be running. A second purge deletes nothing and says so.

--duty-cycle paces the batches: after a batch that took d, purge pauses
d*(1-share)/share, so it keeps at most that share of one connection busy
(0.2 by default, as a consumer's own purge; 1 runs flat out). It prints its
rate in records/s and the time it paused.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := sf.check(); err != nil {
				return err
			}
			if err := sf.mustExist(); err != nil {
				return err
			}
			if consumer == "" {
				return usageError{errors.New("--consumer is required")}
			}
			if olderThan <= 0 {
				return usageError{errors.New("--older-than must be a positive duration, as in 168h")}
			}
			if batch <= 0 {
				return usageError{errors.New("--batch-size must be positive")}
			}
			if !(duty > 0 && duty <= 1) {
				return usageError{errors.New("--duty-cycle must be in (0, 1], as in 0.2; 1 purges flat out")}
			}
			st, err := openSQLStore(cmd.Context(), sf.store, sf.table)
			if err != nil {
				return err
			}
			defer st.db.Close()
			out := cmd.OutOrStdout()
			start := time.Now()
			res, err := idem.Purge(cmd.Context(), st.store, idem.PurgeParams{
				Consumer: consumer, RetentionWindow: olderThan, BatchSize: batch, DryRun: dryRun, DutyCycle: duty,
				OnBatch: func(n int64) {
					if !dryRun {
						fmt.Fprintf(cmd.ErrOrStderr(), "purge: %d records deleted so far\n", n)
					}
				},
			})
			if err != nil {
				return fmt.Errorf("purge %s: %w", st.where, err)
			}
			verb := "deleted"
			if dryRun {
				verb = "would delete"
			}
			switch {
			case res.Horizon.IsZero():
				// No horizon: the runs the consumer recorded add up to
				// less than the window (a run is recorded at its start,
				// then at each heartbeat), so no record is due.
				fmt.Fprintf(out, "%s 0 records of consumer %q: its recorded running time is under %s, so none is due yet\n",
					verb, consumer, olderThan)
			case dryRun:
				fmt.Fprintf(out, "%s %d records of consumer %q outrun by %s of running time (horizon %s)\n",
					verb, res.Deleted, consumer, olderThan, fmtTime(res.Horizon))
			default:
				fmt.Fprintf(out, "%s %d records of consumer %q outrun by %s of running time (horizon %s) in %d batch(es)",
					verb, res.Deleted, consumer, olderThan, fmtTime(res.Horizon), res.Batches)
				if took := time.Since(start); res.Deleted > 0 {
					fmt.Fprintf(out, ", %s (%.0f records/s, paused %s)", took.Round(time.Millisecond),
						float64(res.Deleted)/took.Seconds(), res.Paused.Round(time.Millisecond))
				}
				fmt.Fprintln(out)
			}
			if res.Deleted == 0 {
				// Purged clean before, or a typo: say which consumers there are.
				if err := console.KnownConsumer(cmd.Context(), st.store, consumer); err != nil {
					fmt.Fprintf(out, "note: %v\n", err)
				}
			}
			return nil
		},
	}
	sf.add(cmd)
	cmd.Flags().StringVar(&consumer, "consumer", "", "consumer name (required)")
	cmd.Flags().DurationVar(&olderThan, "older-than", 0, "retention window, as in 168h (required)")
	cmd.Flags().IntVar(&batch, "batch-size", idem.DefaultPurgeBatchSize, "rows per DELETE")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "count, delete nothing")
	cmd.Flags().Float64Var(&duty, "duty-cycle", idem.DefaultPurgeDutyCycle, "most of the purge's time its batches take, in (0, 1]; 1 purges flat out")
	return cmd
}

func newInspectCmd() *cobra.Command {
	var (
		sf          storeFlags
		consumer    string
		id          string
		redisPrefix string
		asJSON      bool
	)
	cmd := &cobra.Command{
		Use:   "inspect",
		Short: "Show the processed-message record of one message",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := sf.check(); err != nil {
				return err
			}
			if err := sf.mustExist(); err != nil {
				return err
			}
			if consumer == "" || id == "" {
				return usageError{errors.New("--consumer and --id are required")}
			}
			st, err := openOperated(cmd.Context(), sf.store, sf.table, redisPrefix)
			if err != nil {
				return err
			}
			defer st.Close()
			rec, err := st.Store.Inspect(cmd.Context(), consumer, id)
			if errors.Is(err, idemdriver.ErrNotFound) {
				if kerr := console.KnownConsumer(cmd.Context(), st.Store, consumer); kerr != nil {
					return kerr
				}
				return fmt.Errorf("no record of message %q for consumer %q", id, consumer)
			}
			if err != nil {
				return err
			}
			if asJSON {
				return inspectJSON(cmd.OutOrStdout(), rec, rec.Error)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintf(tw, "consumer\t%s\n", rec.Consumer)
			fmt.Fprintf(tw, "message id\t%s\n", rec.MessageID)
			fmt.Fprintf(tw, "state\t%s\n", rec.State)
			fmt.Fprintf(tw, "processed at\t%s\n", fmtTime(rec.ProcessedAt))
			fmt.Fprintf(tw, "fingerprint\t%x\n", rec.Fingerprint)
			fmt.Fprintf(tw, "attempts\t%d\n", rec.Attempt)
			if rec.State == idemdriver.StateInProgress {
				fmt.Fprintf(tw, "fencing token\t%d\n", rec.Token)
				fmt.Fprintf(tw, "lease expires at\t%s\n", fmtTime(rec.LeaseExpiresAt))
			}
			if rec.Error != "" {
				fmt.Fprintf(tw, "last error\t%s\n", rec.Error)
			}
			return tw.Flush()
		},
	}
	sf.add(cmd)
	cmd.Flags().StringVar(&consumer, "consumer", "", "consumer name (required)")
	cmd.Flags().StringVar(&id, "id", "", "message ID (required)")
	cmd.Flags().Lookup("store").Usage = "store URL: sqlite:PATH, postgres://..., mysql://..., redis://... (required)"
	cmd.Flags().StringVar(&redisPrefix, "redis-prefix", "idem:", "key prefix of a Redis store (--store redis://...)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the record as JSON")
	return cmd
}

func newStatsCmd() *cobra.Command {
	var (
		sf     storeFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Show record counts per consumer, with the oldest and newest record, and the outbox backlog",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := sf.openExisting(cmd.Context())
			if err != nil {
				return err
			}
			defer st.db.Close()
			stats, err := st.store.Stats(cmd.Context())
			if err != nil {
				return err
			}
			outbox := outboxStats(cmd, st.store)
			if asJSON {
				return statsJSONOut(cmd.OutOrStdout(), stats, outbox)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "CONSUMER\tRECORDS\tOLDEST\tNEWEST")
			for _, s := range stats {
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", s.Consumer, s.Count, fmtTime(s.Oldest), fmtTime(s.Newest))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if len(stats) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "no records in this table yet")
			}
			return printOutboxStats(cmd, outbox)
		},
	}
	sf.add(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON: {consumers: [{consumer, records, oldest, newest}], outbox: {pending, failed, oldest_pending_s} or null}")
	return cmd
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

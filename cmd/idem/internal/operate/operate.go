// Package operate is the idem command's operator commands: failed,
// retry, release, replay and console. Each reads its flags and makes one call
// into the store's operator capabilities (through package console); the
// idem command registers them with a function that opens a store.
package operate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/idemdriver"
)

// Opened is an open store.
type Opened struct {
	Store console.Store
	// Where names the database for messages, without credentials.
	Where string
	Close func() error
}

// Opener opens the store at storeURL: a SQL store with the
// processed-messages table table ("" for the default), or a Redis store
// with the key prefix redisPrefix. Its errors never hold a password.
type Opener func(ctx context.Context, storeURL, table, redisPrefix string) (Opened, error)

// BrokerOpener connects to the broker at brokerURL for its dead letters;
// the returned function closes the connection. Its errors never hold a
// password.
type BrokerOpener func(ctx context.Context, brokerURL string) (console.DeadLetters, func(), error)

// UsageError marks bad flags or arguments (the idem command exits 2).
type UsageError struct{ Err error }

// Error is the wrapped error's text.
func (e UsageError) Error() string { return e.Err.Error() }

// Unwrap returns the wrapped error.
func (e UsageError) Unwrap() error { return e.Err }

// Commands returns the operator commands over the stores open opens and
// the brokers openBroker connects to (nil: no dead letters). now is the
// clock of the ages shown (nil: time.Now).
func Commands(open Opener, openBroker BrokerOpener, now func() time.Time) []*cobra.Command {
	if now == nil {
		now = time.Now
	}
	return []*cobra.Command{newFailedCmd(open, openBroker, now), newRetryCmd(open, now), newReleaseCmd(open, now),
		newReplayCmd(open, openBroker, now), newConsoleCmd(open, openBroker)}
}

// brokerFlags are the flags of a broker's dead letters.
type brokerFlags struct{ broker, deadLetter string }

func (b *brokerFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&b.broker, "broker", "", "broker URL of the dead letters: nats://..., redis://..., kafka://... (or IDEM_BROKER)")
	cmd.Flags().StringVar(&b.deadLetter, "dead-letter", "", "dead-letter destination: a subject (NATS), a stream (Redis Streams) or a topic (Kafka)")
}

// open connects to the flags' broker.
func (b *brokerFlags) open(ctx context.Context, openBroker BrokerOpener) (console.DeadLetters, func(), error) {
	if b.broker == "" {
		b.broker = os.Getenv("IDEM_BROKER")
	}
	if b.broker == "" || openBroker == nil {
		return nil, nil, UsageError{console.ErrNoBroker}
	}
	return openBroker(ctx, b.broker)
}

// storeFlags are the flags of the store.
type storeFlags struct{ store, table, redisPrefix string }

func (s *storeFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&s.store, "store", "", "store URL: sqlite:PATH, postgres://..., mysql://..., redis://... (required)")
	cmd.Flags().StringVar(&s.table, "table", "", "processed-messages table of a SQL store (default idem_processed)")
	cmd.Flags().StringVar(&s.redisPrefix, "redis-prefix", "idem:", "key prefix of a Redis store")
}

func (s *storeFlags) open(ctx context.Context, open Opener) (Opened, error) {
	if s.store == "" {
		return Opened{}, UsageError{errors.New("--store is required (or IDEM_STORE)")}
	}
	return open(ctx, s.store, s.table, s.redisPrefix)
}

func newFailedCmd(open Opener, openBroker BrokerOpener, now func() time.Time) *cobra.Command {
	var (
		sf                  storeFlags
		bf                  brokerFlags
		consumer, cursor    string
		errText             string
		inProgress, outbox  bool
		limit, scan         int
		asJSON, showPayload bool
	)
	cmd := &cobra.Command{
		Use:   "failed",
		Short: "List a consumer's failed records (or leases in progress, or the outbox rows that failed), newest first",
		Long: `failed lists the work that needs an operator, newest first, a page at a time:

  idem failed --consumer C               records failed for good (poisoned, or out of attempts)
  idem failed --consumer C --in-progress records in progress: their lease, holder token, attempt
  idem failed --outbox                   outbox rows failed for good, grouped by error, and a page of them
  idem failed --broker URL --dead-letter D [--consumer C]
                                         the dead letters of D (a subject, a stream), grouped by
                                         reason and error (the newest --scan), newest first

A page of records in progress walks the (consumer, processed_at) index
from --cursor and examines at most --scan records, so it costs the same on
a table of any size; it may hold fewer than --limit records and still have
a next one. On PostgreSQL and SQLite a page of failed records is read
through their own index and holds --limit of them (on MySQL and MariaDB,
as for records in progress, those among --scan records). The next page's
cursor is printed last (JSON: "next").`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if bf.deadLetter != "" {
				if outbox {
					return UsageError{errors.New("give --dead-letter or --outbox, not both")}
				}
				dls, closeBroker, err := bf.open(cmd.Context(), openBroker)
				if err != nil {
					return err
				}
				defer closeBroker()
				v, err := console.ReadDeadLetters(cmd.Context(), dls, bf.deadLetter, consumer, cursor, limit, scan, showPayload)
				if err != nil {
					return badInput(err, dls.Where())
				}
				if asJSON {
					return console.WriteJSON(cmd.OutOrStdout(), v)
				}
				return printDeadLetters(cmd.OutOrStdout(), v)
			}
			if outbox == (consumer != "") {
				if bf.broker != "" && !outbox {
					return UsageError{errors.New("--broker lists dead letters: give --dead-letter DEST too (or --consumer NAME for failed records, --outbox for outbox rows)")}
				}
				return UsageError{errors.New("give --consumer NAME (records) or --outbox (outbox rows); run idem stats to see the consumers")}
			}
			st, err := sf.open(cmd.Context(), open)
			if err != nil {
				return err
			}
			defer st.Close()
			out := cmd.OutOrStdout()
			if outbox {
				v, err := console.ReadOutbox(cmd.Context(), st.Store, errText, limit, cursor, showPayload)
				if err != nil {
					return badInput(err, st.Where)
				}
				if asJSON {
					return console.WriteJSON(out, v)
				}
				return printOutbox(out, v)
			}
			state := idemdriver.StateFailed
			if inProgress {
				state = idemdriver.StateInProgress
			}
			p := idemdriver.ListRecordsParams{Consumer: consumer, State: state, Limit: limit, Scan: scan, Cursor: cursor}
			page, err := st.Store.ListRecords(cmd.Context(), &p)
			if err != nil {
				return badInput(err, st.Where)
			}
			if len(page.Records) == 0 && page.Next == "" && cursor == "" {
				if err := console.KnownConsumer(cmd.Context(), st.Store, consumer); err != nil {
					return fmt.Errorf("%s: %w", st.Where, err)
				}
			}
			v := console.NewRecordPageView(consumer, state, page, now())
			if asJSON {
				return console.WriteJSON(out, v)
			}
			return printRecords(out, v)
		},
	}
	sf.add(cmd)
	bf.add(cmd)
	f := cmd.Flags()
	f.StringVar(&consumer, "consumer", "", "consumer name (or --outbox)")
	f.BoolVar(&inProgress, "in-progress", false, "list the records in progress (leases) instead of the failed ones")
	f.BoolVar(&outbox, "outbox", false, "list the outbox rows failed for good, grouped by error")
	f.StringVar(&errText, "error", "", "with --outbox: only the rows with this error text")
	f.IntVar(&limit, "limit", idemdriver.DefaultPageSize, "most items on the page (1 to 500)")
	f.IntVar(&scan, "scan", 0, "most records a page examines (default 10000); with --dead-letter, how many of the newest the groups count (default 1000, at most 10000)")
	f.StringVar(&cursor, "cursor", "", "the cursor a previous page printed")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	f.BoolVar(&showPayload, "show-payloads", false, "with --outbox or --dead-letter: print the payloads and headers")
	return cmd
}

// badInput makes the store's refusals of bad input usage errors.
func badInput(err error, where string) error {
	switch {
	case errors.Is(err, idemdriver.ErrInvalidCursor):
		return UsageError{errors.New("--cursor is not one a page printed")}
	case errors.Is(err, idemdriver.ErrInvalidConfig), errors.Is(err, idemdriver.ErrInvalidConsumerName),
		errors.Is(err, idemdriver.ErrInvalidMessageID), errors.Is(err, idemdriver.ErrMissingMessageID), errors.Is(err, console.ErrBadAction):
		return UsageError{err}
	case errors.Is(err, console.ErrNoOutbox), errors.Is(err, console.ErrNoDeadLetters):
		if strings.Contains(err.Error(), where) { // named already (an unbrowsable broker)
			return err
		}
		return fmt.Errorf("%s: %w", where, err)
	}
	return err
}

func printRecords(w io.Writer, v console.RecordPageView) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "MESSAGE ID\tSTATE\tATTEMPT\tTOKEN\tAGE\tLEASE\tERROR")
	for _, r := range v.Records {
		lease := "-"
		switch {
		case r.LeaseExpiresAt != nil && r.LeaseLive:
			lease = "live until " + *r.LeaseExpiresAt
		case r.LeaseExpiresAt != nil:
			lease = "ended " + *r.LeaseExpiresAt
		}
		fmt.Fprintf(tw, "%q\t%s\t%d\t%d\t%s\t%s\t%s\n", r.MessageID, r.State, r.Attempt, r.Token,
			(time.Duration(r.AgeS * float64(time.Second))).Round(time.Second), lease, oneLine(r.Error))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(v.Records) == 0 {
		if v.State == "failed" {
			fmt.Fprintf(w, "no failed records of consumer %q on this page\n", v.Consumer)
		} else {
			fmt.Fprintf(w, "no records of consumer %q in progress on this page\n", v.Consumer)
		}
	}
	if v.Next != "" {
		fmt.Fprintf(w, "next page: --cursor %s\n", v.Next)
	}
	return nil
}

func printDeadLetters(w io.Writer, v console.DeadLettersView) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "DEAD LETTERS\tNEWEST\tREASON\tERROR\t(the newest %d of %s on %s)\n", v.Scanned, v.Destination, v.Broker)
	for _, g := range v.Groups {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t\n", g.Count, deref(g.Newest), g.Reason, oneLine(g.Error))
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "POSITION\tAT\tMESSAGE ID\tSOURCE\tREASON\tERROR")
	for _, d := range v.Letters {
		fmt.Fprintf(tw, "%s\t%s\t%q\t%s\t%s\t%s\n", d.Position, deref(d.At), d.MessageID, d.Source, d.Reason, oneLine(d.Error))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(v.Letters) == 0 {
		fmt.Fprintln(w, "no dead letters on this page")
	}
	if v.Next != "" {
		fmt.Fprintf(w, "next page: --cursor %s\n", v.Next)
	}
	return nil
}

func printOutbox(w io.Writer, v console.OutboxView) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ROWS\tNEWEST FAILURE\tERROR")
	for _, g := range v.Groups {
		fmt.Fprintf(tw, "%d\t%s\t%s\n", g.Count, deref(g.Newest), oneLine(g.Error))
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "OUTBOX ID\tDESTINATION\tATTEMPTS\tFAILED AT\tERROR")
	for _, r := range v.Rows {
		fmt.Fprintf(tw, "%q\t%s\t%d\t%s\t%s\n", r.ID, r.Destination, r.Attempts, deref(r.FailedAt), oneLine(r.Error))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(v.Rows) == 0 {
		fmt.Fprintln(w, "no outbox rows failed for good on this page")
	}
	if v.Next != "" {
		fmt.Fprintf(w, "next page: --cursor %s\n", v.Next)
	}
	return nil
}

func deref(s *string) string {
	if s == nil {
		return "-"
	}
	return *s
}

// oneLine is s readable in one table cell: each control character (a
// newline, a tab, an escape) and each line or paragraph separator becomes
// a space, bytes that are not UTF-8 become U+FFFD, and the text is cut at
// 200 bytes on a character boundary, marked "...".
func oneLine(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || r == '\u2028' || r == '\u2029' {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
	if len(s) > 200 {
		cut := 200
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "..."
	}
	return s
}

func newRetryCmd(open Opener, now func() time.Time) *cobra.Command {
	var (
		sf                     storeFlags
		consumer, id, outboxID string
		asJSON                 bool
	)
	cmd := &cobra.Command{
		Use:   "retry",
		Short: "Make a failed record retryable, or a failed outbox row pending again",
		Long: `retry undoes a failure for good, once:

  idem retry --consumer C --id M    the record becomes retryable: the next delivery of the
                                    message (a redelivery or a replay) is processed as attempt 1,
                                    resuming after its last completed step
  idem retry --outbox-id ID         the outbox row is pending again: the relay sends it next

A second run changes nothing and says so; a completed record or a sent row
is refused, and nothing changes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			a := console.Action{Kind: console.ActionRetry, Consumer: consumer, MessageID: id}
			switch {
			case outboxID != "" && (consumer != "" || id != ""):
				return UsageError{errors.New("give --consumer and --id (a record) or --outbox-id (an outbox row), not both")}
			case outboxID != "":
				a = console.Action{Kind: console.ActionRetryOutbox, OutboxID: outboxID}
			case consumer == "" || id == "":
				return UsageError{errors.New("--consumer and --id are required (or --outbox-id)")}
			}
			return runAction(cmd, open, &sf, a, asJSON, now)
		},
	}
	sf.add(cmd)
	cmd.Flags().StringVar(&consumer, "consumer", "", "consumer name")
	cmd.Flags().StringVar(&id, "id", "", "message ID")
	cmd.Flags().StringVar(&outboxID, "outbox-id", "", "ID of a failed outbox row")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON")
	return cmd
}

func newReleaseCmd(open Opener, now func() time.Time) *cobra.Command {
	var (
		sf           storeFlags
		consumer, id string
		token        int64
		asJSON       bool
	)
	cmd := &cobra.Command{
		Use:   "release",
		Short: "End a stuck lease, so the next delivery takes the message over",
		Long: `release ends the lease of the attempt holding --token (as listed by
idem failed --in-progress or idem inspect), as that attempt's own release
would: the record stays in progress and the next delivery takes it over;
the stuck attempt's later writes are refused (lease lost). The token makes
it safe to repeat: once the token no longer holds the record, release
changes nothing, so it never ends a later attempt's lease.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if consumer == "" || id == "" {
				return UsageError{errors.New("--consumer and --id are required")}
			}
			st, err := sf.open(cmd.Context(), open)
			if err != nil {
				return err
			}
			defer st.Close()
			if token == 0 {
				rec, err := st.Store.Inspect(cmd.Context(), consumer, id)
				if err != nil {
					return badInput(err, st.Where)
				}
				if rec.State != idemdriver.StateInProgress {
					return fmt.Errorf("message %q of consumer %q is %s: it has no lease to release", id, consumer, rec.State)
				}
				return UsageError{fmt.Errorf("--token is required: the record's token is %d (attempt %d, lease until %s); run again with --token %d",
					rec.Token, rec.Attempt, rec.LeaseExpiresAt.UTC().Format(time.RFC3339), rec.Token)}
			}
			a := console.Action{Kind: console.ActionRelease, Consumer: consumer, MessageID: id, Token: token}
			return act(cmd, st, nil, a, asJSON, now)
		},
	}
	sf.add(cmd)
	cmd.Flags().StringVar(&consumer, "consumer", "", "consumer name (required)")
	cmd.Flags().StringVar(&id, "id", "", "message ID (required)")
	cmd.Flags().Int64Var(&token, "token", 0, "the holder's fencing token (required; without it, release prints the record's)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON")
	return cmd
}

func newReplayCmd(open Opener, openBroker BrokerOpener, now func() time.Time) *cobra.Command {
	var (
		sf                 storeFlags
		bf                 brokerFlags
		consumer, position string
		force, asJSON      bool
	)
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Replay a dead letter to its source, its record made retryable first, so that it is processed once",
		Long: `replay republishes the dead letter at --position of --dead-letter (as idem
failed --dead-letter lists them) to the source it was read from, with the
same message ID, after making the message's record of --consumer retryable:
its next delivery, the replay, is processed as attempt 1 of a fresh round.
A failed (poisoned) record is retried; a record that idem consume completed
with the dead letter's outcome (the service's final 4xx or 3xx answer, or
an unknown outcome) is reopened, its recorded answer and recovery points
deleted, so that the replay calls the service again (fix the service
first).

It refuses, and publishes nothing, when the record is completed with a
success (processed already: by an earlier replay, or a redelivery), or
retryable already (replayed or retried before, its delivery awaited:
--force replays anyway, and the consumer drops a copy after the first as a
duplicate), or held by a live attempt; and a dead letter without a usable
message ID. On NATS JetStream it refuses a replay the source stream's
duplicate window would drop (the original's Nats-Msg-Id is the replay's),
saying when it can run, and reports a drop the publish ack shows rather
than success.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			a := console.Action{Kind: console.ActionReplay, Consumer: consumer, DeadLetter: bf.deadLetter, Position: position, Force: force}
			if err := a.Check(); err != nil {
				return UsageError{fmt.Errorf("missing %s: %w (idem failed --broker URL --dead-letter D lists the dead letters' positions; --consumer is the idem consumer whose record the message had)",
					strings.Join(missingFlags(map[string]string{"--consumer": consumer, "--dead-letter": bf.deadLetter, "--position": position}), ", "), err)}
			}
			dls, closeBroker, err := bf.open(cmd.Context(), openBroker)
			if err != nil {
				return err
			}
			defer closeBroker()
			st, err := sf.open(cmd.Context(), open)
			if err != nil {
				return err
			}
			defer st.Close()
			return act(cmd, st, dls, a, asJSON, now)
		},
	}
	sf.add(cmd)
	bf.add(cmd)
	cmd.Flags().StringVar(&consumer, "consumer", "", "the consumer whose record of the message is made retryable, or reopened (required)")
	cmd.Flags().StringVar(&position, "position", "", "the dead letter's position: a stream sequence (NATS), an entry ID (Redis) (required)")
	cmd.Flags().BoolVar(&force, "force", false, "replay even if the record is retryable already (no copy on its way)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON")
	return cmd
}

func runAction(cmd *cobra.Command, open Opener, sf *storeFlags, a console.Action, asJSON bool, now func() time.Time) error {
	st, err := sf.open(cmd.Context(), open)
	if err != nil {
		return err
	}
	defer st.Close()
	return act(cmd, st, nil, a, asJSON, now)
}

func act(cmd *cobra.Command, st Opened, dls console.DeadLetters, a console.Action, asJSON bool, now func() time.Time) error {
	v, err := console.Run(cmd.Context(), st.Store, dls, a, now)
	switch {
	case errors.Is(err, idemdriver.ErrNotFound):
		return fmt.Errorf("%s: nothing changed: %w", a, err)
	case errors.Is(err, console.ErrNotReplayable), errors.Is(err, console.ErrReplayDropped):
		return fmt.Errorf("%s: %w", a, err)
	case errors.Is(err, idemdriver.ErrWrongState):
		return fmt.Errorf("%s: refused, nothing changed: %w", a, err)
	case err != nil:
		return badInput(err, st.Where)
	}
	if asJSON {
		return console.WriteJSON(cmd.OutOrStdout(), v)
	}
	_, err = fmt.Fprintln(cmd.OutOrStdout(), v.Message)
	return err
}

// missingFlags returns the names of the flags whose value is empty, in
// name order, so that a usage error names only what is missing.
func missingFlags(values map[string]string) []string {
	var missing []string
	for name, v := range values {
		if v == "" {
			missing = append(missing, name)
		}
	}
	slices.Sort(missing)
	return missing
}

//go:build !nodemo

package demo

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/connect"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idemsql"
)

// The receipts story: each payment the payments consumer charges emits a
// PaymentCharged event through the outbox, in the transaction of its
// ledger row and its claim; the demo's relay sends it to the broker, and
// a second idem consumer downstream, the receipts service, sends one
// receipt per payment through the fake provider, with an idempotency key
// derived from the event's ID. The relay dies now and then, after a
// commit and before sending, or after sending and before marking the rows
// sent; the rows come back when the dead relay's lease ends, and a re-send
// carries the same outgoing ID, which the receipts consumer absorbs.

// receiptsConsumer is the consumer name of the demo's receipts service.
const receiptsConsumer = "idem-demo-receipts"

// demoTable is the processed-messages table of the demo's stores: a table
// of its own, so that on a database it shares the demo's relay sends
// only the demo's events, a fresh run clears only the demo's rows, and
// the run waits only for its own outbox (demoOutboxTable).
const (
	demoTable       = "idem_demo_processed"
	demoOutboxTable = demoTable + "_outbox"
)

// Timing of the demo's relay: a short lease, so the rows of a relay that
// died come back within seconds, and short polls and retries.
const (
	demoRelayLease    = 2 * time.Second
	demoRelayMaxPoll  = 250 * time.Millisecond
	demoRelayMinRetry = 100 * time.Millisecond
	demoRelayMaxRetry = 2 * time.Second
)

// eventsBroker is what the receipts story needs of a broker: where the
// PaymentCharged events go, the relay's publisher there, the receipts
// consumers reading them, and what is left unfinished there.
type eventsBroker interface {
	eventsDestination() string
	// eventsPublisher returns the relay's publisher (the adapter's
	// NewPublisher), on a connection the broker's close closes.
	eventsPublisher(ctx context.Context) (idem.Publisher, error)
	// receiptsMember returns one receipts consumer running p, on a
	// connection or client of its own.
	receiptsMember(ctx context.Context, p idem.Processor, log *slog.Logger) (*member, error)
	// eventsUnfinished counts events not yet delivered and acknowledged.
	eventsUnfinished(ctx context.Context) (int, error)
}

// paymentCharged is the PaymentCharged event body.
type paymentCharged struct {
	PaymentID   string `json:"payment_id"`
	Customer    string `json:"customer"`
	AmountCents int64  `json:"amount_cents"`
	ChargeID    int64  `json:"charge_id"`
}

// receiptsStory is the demo's state for the receipts story.
type receiptsStory struct {
	events   idem.Publisher // the broker's publisher to the events destination
	relay    *idem.Relay    // nil --without-idem
	receipts *idem.Consumer[*sql.Tx]
	// receiptsSt is the receipts service's SQL store: a SQLite file of its
	// own beside a SQLite store (a second writer), else the same database.
	receiptsSt *connect.SQLStore
	// mail is the provider that sends the receipts (by email, say): a third
	// party of its own, with its own database file, so the receipts do not
	// queue behind the charges.
	mail *provider

	relayCrashes, receiptCrashes atomic.Int64
	naiveEvents, naiveReceipts   atomic.Int64 // --without-idem: events published, receipt keys used
}

// chargedEvent is the PaymentCharged event of payment p, charged as chargeID.
func (r *demoRun) chargedEvent(p payment, chargeID int64) idem.OutgoingMessage {
	body, _ := json.Marshal(paymentCharged{PaymentID: p.PaymentID, Customer: p.Customer, AmountCents: p.AmountCents, ChargeID: chargeID})
	return idem.OutgoingMessage{Name: "charged", Destination: r.broker.eventsDestination(), Key: p.Customer,
		Payload: body, Headers: map[string]string{"type": "PaymentCharged"}}
}

// openReceipts prepares the receipts story before the payments consumer
// is made (it wakes the relay): the broker's events publisher, the relay
// over the store's outbox (not --without-idem) and the receipts consumer
// of the store's mode, with its store (in dir for SQLite).
func (r *demoRun) openReceipts(ctx context.Context, dir string, fresh bool, hooks []idem.Hook) (err error) {
	if r.events, err = r.broker.eventsPublisher(ctx); err != nil {
		return fmt.Errorf("the events publisher: %w", err)
	}
	if r.mail, err = openProvider(ctx, filepath.Join(dir, "mail.db")); err != nil {
		return err
	}
	if fresh {
		if err := r.mail.reset(ctx); err != nil {
			return err
		}
	}
	r.receiptsSt = r.st
	if r.st.Dialect == idemsql.SQLite && r.lease == nil {
		if r.receiptsSt, err = connect.OpenSQL(ctx, "sqlite:"+filepath.Join(dir, "receipts.db"), demoTable); err == nil {
			err = r.receiptsSt.Store.Migrate(ctx)
		}
		if err != nil {
			return fmt.Errorf("the receipts service's store: %w", err)
		}
	}
	if fresh {
		for _, d := range []struct {
			st       *connect.SQLStore
			q, value string
		}{
			{r.receiptsSt, `DELETE FROM ` + demoTable + ` WHERE ` + consumerIs(r.receiptsSt.Dialect), receiptsConsumer},
			{r.st, `DELETE FROM ` + demoOutboxTable + ` WHERE consumer = ?`, demoConsumer},
		} {
			if _, err := d.st.DB.ExecContext(ctx, connect.Rebind(d.st.Dialect, d.q), d.value); err != nil {
				return fmt.Errorf("reset the demo tables on %s: %w", d.st.Where, err)
			}
		}
	}
	if r.o.WithoutIdem {
		return nil
	}
	faults := &relayFaults{OutboxStore: r.st.Store, pub: r.events, rate: r.o.CrashRate, draws: r.draws, crashes: &r.relayCrashes}
	r.relay, err = idem.NewRelay(idem.RelayConfig{Store: faults, Publisher: faults, Workers: 1, Lease: demoRelayLease,
		MaxPoll: demoRelayMaxPoll, MinRetry: demoRelayMinRetry, MaxRetry: demoRelayMaxRetry,
		KeepSent: true, Retention: -1, // the report counts the rows emitted
		Logger: r.log})
	if err != nil || r.lease != nil {
		return err
	}
	r.receipts, err = idem.NewConsumer(r.receiptsSt.Store, idem.Config{Name: receiptsConsumer, PurgeInterval: -1, Hooks: hooks})
	return err
}

func (r *demoRun) closeReceipts() {
	if r.receipts != nil {
		r.receipts.Close()
	}
	if r.mail != nil {
		r.mail.close()
	}
	if r.receiptsSt != nil && r.receiptsSt != r.st {
		r.receiptsSt.DB.Close()
	}
}

// wakeRelay is the relay the payments consumer wakes after each commit
// that emitted (and for a duplicate whose event is unsent), so the event
// goes out at once. Not on SQLite: its single writer would spend two
// writes (claim, mark) on every event; there the relay polls every 50ms
// while there is work and sends what came meanwhile in one round.
func (r *demoRun) wakeRelay() *idem.Relay {
	if r.st.Dialect == idemsql.SQLite {
		return nil
	}
	return r.relay
}

// runReceipts starts the relay and the receipts consumers under wg.
func (r *demoRun) runReceipts(ctx context.Context, wg *sync.WaitGroup) {
	if r.relay != nil {
		wg.Add(1)
		go func() { defer wg.Done(); _ = r.relay.Run(ctx) }()
	}
	for i := 0; i < r.o.Consumers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.consumeLane(ctx, r.broker.receiptsMember, r.processReceipt, &r.receiptCrashes, false)
		}()
	}
}

// processReceipt runs one PaymentCharged delivery through the receipts
// consumer of the store's mode. Half of the --crash-rate crashes come
// here, after a commit, as for the payments.
func (r *demoRun) processReceipt(ctx context.Context, m idem.Message) (out idem.Outcome, err error) {
	switch {
	case r.o.WithoutIdem:
		out, err = r.receiptNaive(ctx, m)
	case r.lease != nil:
		out, err = r.lease.receipts.Process(ctx, m, func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
			return idem.Result{}, r.sendReceipt(ctx, a.Key("receipt"), m)
		})
	default:
		out, err = r.receipts.Process(ctx, m, func(ctx context.Context, _ *sql.Tx, m idem.Message) error {
			return r.sendReceipt(ctx, idem.DeriveKey(receiptsConsumer, m.ID, "receipt"), m)
		})
	}
	if out.Status == idem.Processed && r.draws.crash("receipts-after-commit", m.ID, r.o.CrashRate/2) {
		return idem.Outcome{Status: idem.Failed, MessageID: m.ID, Err: errCrashAfterCommit}, errCrashAfterCommit
	}
	return out, err
}

// sendReceipt is the receipts handler: it asks the provider to send the
// receipt of the event's payment with key, which the redelivery of the
// event sends again. Half of the --crash-rate crashes happen after that
// call and before the commit.
func (r *demoRun) sendReceipt(ctx context.Context, key string, m idem.Message) error {
	var e paymentCharged
	if err := json.Unmarshal(m.Payload, &e); err != nil {
		return idem.Permanent(fmt.Errorf("event %s: %w", m.ID, err))
	}
	if err := r.mail.receipt(ctx, key, e.PaymentID); err != nil {
		return err
	}
	if r.draws.crash("receipts-before-commit", m.ID, r.o.CrashRate/2) {
		return errCrashBeforeCommit
	}
	return nil
}

// receiptNaive is the receipts consumer of --without-idem: no record of
// the events it processed, and a new provider key per attempt, so every
// copy of an event sends a receipt.
func (r *demoRun) receiptNaive(ctx context.Context, m idem.Message) (idem.Outcome, error) {
	err := r.sendReceipt(ctx, fmt.Sprintf("naive-receipt-%s-%d", m.ID, r.naiveReceipts.Add(1)), m)
	if err != nil {
		return idem.Outcome{Status: idem.Failed, MessageID: m.ID, Err: err}, err
	}
	return idem.Outcome{Status: idem.Processed, MessageID: m.ID}, nil
}

// publishChargedNaive is how the naive payments consumer announces a
// charge: it publishes the event itself after its commit, with a new ID
// per publish, so every charge (doubles included) gets an event.
func (r *demoRun) publishChargedNaive(ctx context.Context, p payment, chargeID int64) error {
	e := r.chargedEvent(p, chargeID)
	n := r.naiveEvents.Add(1)
	errs := r.events.Publish(ctx, []idem.Outgoing{{ID: fmt.Sprintf("naive-event-%s-%d", p.PaymentID, n),
		Destination: e.Destination, Key: e.Key, Payload: e.Payload, Headers: e.Headers}})
	return errors.Join(errs...)
}

// emitChargedLeased writes the ledger row of lease mode and its
// PaymentCharged event in one transaction of the ledger's database: the
// row keyed by ledgerKey, the event by its outgoing ID, derived from the
// message ID, so an attempt that runs again writes neither twice.
func (r *demoRun) emitChargedLeased(ctx context.Context, m idem.Message, p payment, chargeID int64, ledgerKey string) error {
	tx, err := r.st.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx,
		`INSERT INTO idem_demo_ledger (payment_id, customer, amount_cents, charge_id, entry_key) VALUES (?, ?, ?, ?, ?)
		 ON CONFLICT (entry_key) DO NOTHING`,
		p.PaymentID, p.Customer, p.AmountCents, chargeID, ledgerKey); err != nil {
		return err
	}
	e := r.chargedEvent(p, chargeID)
	err = r.st.Store.EmitTx(ctx, tx, &idemdriver.EmitParams{Consumer: demoConsumer, Messages: []idemdriver.OutgoingRecord{{
		ID: idem.OutgoingID(demoConsumer, m.ID, e.Name, 0), Consumer: demoConsumer, SourceID: m.ID,
		Destination: e.Destination, Key: e.Key, Payload: e.Payload, Headers: e.Headers}}})
	if err != nil {
		return err
	}
	return tx.Commit() // the ledger is SQLite: the relay polls (wakeRelay)
}

// receiptsDone reports whether the receipts story is over, once the
// payments are: every event was sent (no outbox row pending), delivered
// and acknowledged, and, with idem, every payment has its receipt.
func (r *demoRun) receiptsDone(ctx context.Context) bool {
	if r.relay != nil {
		st, err := r.st.Store.OutboxStats(ctx)
		if err != nil || st.Pending > 0 {
			return false
		}
		if _, _, distinct, err := r.mail.receiptTotals(ctx); err != nil || distinct < int64(r.o.Messages) {
			return false
		}
	}
	n, err := r.broker.eventsUnfinished(ctx)
	return err == nil && n == 0
}

// reportReceipts adds the receipts story's counters to rep.
func (r *demoRun) reportReceipts(ctx context.Context, rep *report) error {
	sent, doubles, distinct, err := r.mail.receiptTotals(ctx)
	if err != nil {
		return err
	}
	rep.EventsEmitted = r.naiveEvents.Load()
	if !r.o.WithoutIdem {
		q := connect.Rebind(r.st.Dialect, `SELECT count(*) FROM `+demoOutboxTable+` WHERE consumer = ?`)
		if err := r.st.DB.QueryRowContext(ctx, q, demoConsumer).Scan(&rep.EventsEmitted); err != nil {
			return fmt.Errorf("count the events emitted on %s: %w", r.st.Where, err)
		}
	}
	rep.RelayCrashes = r.relayCrashes.Load()
	rep.ReceiptCrashes = r.receiptCrashes.Load()
	rep.ReceiptsSent, rep.DoubleReceipts = sent, doubles
	rep.ReceiptReplays = r.mail.receiptReplays.Load()
	rep.LostReceipts = int64(r.o.Messages) - distinct
	return nil
}

// receiptsOK reports whether every payment got exactly one receipt.
func (rep *report) receiptsOK() bool {
	return rep.DoubleReceipts == 0 && rep.LostReceipts == 0 && rep.ReceiptsSent == int64(rep.Messages)
}

// relayFaults is the demo relay's store and publisher: it makes the relay
// die, at the --crash-rate per message sent (at most once in
// maxRelayDeath rounds, so that a batch taken again after a death
// likely goes through), half of the time after a commit and before
// sending (nothing is published), half after sending and before marking
// (the broker has the messages). A dead relay's marks
// are lost, as they would be with its process: the rows stay leased and
// unsent until the lease ends, and the relay, as the one started in its
// place would, claims and sends them again, with the same outgoing IDs.
// The demo's relay runs one round at a time (Workers 1), so a death lasts
// from the publish to the next claim.
type relayFaults struct {
	idemdriver.OutboxStore
	pub     idem.Publisher
	rate    float64
	draws   *crashDraws // keyed by the batch's first row
	crashes *atomic.Int64
	dead    atomic.Bool
}

// maxRelayDeath bounds the chance that one relay round dies.
const maxRelayDeath = 0.25

// errRelayCrash is what a relay that died answers instead of marking.
var errRelayCrash = errors.New("the relay died before marking its rows")

func (f *relayFaults) ClaimOutgoing(ctx context.Context, p *idemdriver.ClaimOutgoingParams) ([]idemdriver.OutgoingRecord, error) {
	f.dead.Store(false) // a relay that takes over
	return f.OutboxStore.ClaimOutgoing(ctx, p)
}

func (f *relayFaults) MarkSent(ctx context.Context, p *idemdriver.MarkSentParams) error {
	if f.dead.Load() {
		return errRelayCrash
	}
	return f.OutboxStore.MarkSent(ctx, p)
}

func (f *relayFaults) MarkFailed(ctx context.Context, p *idemdriver.MarkFailedParams) error {
	if f.dead.Load() {
		return errRelayCrash
	}
	return f.OutboxStore.MarkFailed(ctx, p)
}

func (f *relayFaults) Publish(ctx context.Context, msgs []idem.Outgoing) []error {
	if len(msgs) == 0 {
		return nil
	}
	x := f.draws.draw("relay", msgs[0].ID)
	die := min(f.rate*float64(len(msgs)), maxRelayDeath)
	switch {
	case x < die/2: // after the commit, before sending
		f.dead.Store(true)
		f.crashes.Add(1)
		errs := make([]error, len(msgs))
		for i := range errs {
			errs[i] = errRelayCrash
		}
		return errs
	case x < die: // after sending, before marking
		errs := f.pub.Publish(ctx, msgs)
		f.dead.Store(true)
		f.crashes.Add(1)
		return errs
	}
	return f.pub.Publish(ctx, msgs)
}

// printReceiptRows prints the receipts story's counters, one line each.
func printReceiptRows(row func(k string, v any, why string), rep report) {
	emitted := "PaymentCharged events written to the outbox in the transaction of their charge, one per payment (a rollback emits nothing)"
	if rep.Settings.WithoutIdem {
		emitted = "PaymentCharged events the naive consumer published itself after its commit, a new ID each time, one per charge"
	}
	row("events emitted", rep.EventsEmitted, emitted)
	row("relay crashes", rep.RelayCrashes, "relays killed after a commit and before sending, or after sending and before marking the rows sent: their rows were sent (again, with the same IDs) when their lease ended")
	row("receipts consumer crashes", rep.ReceiptCrashes, "receipts consumers killed after the provider call (before the commit) or after the commit (before the ack)")
	row("receipts sent", rep.ReceiptsSent, "receipts the provider sent, from the receipts consumer downstream: one per payment when all is well")
	row("receipt replays (same key)", rep.ReceiptReplays, "receipt requests answered with the earlier receipt, because the redelivered event carried the same ID and so the same derived key")
	row("double receipts", rep.DoubleReceipts, "receipts beyond the first for one payment")
	row("lost receipts", rep.LostReceipts, "payments without a receipt")
}

// consumerIs is the condition on the demo's processed table that selects
// the records of the consumer named by the placeholder ?: on PostgreSQL
// the table refers to its consumer by key (schema v2, migrations 014
// and 015), elsewhere by name.
func consumerIs(d idemsql.Dialect) string {
	if d == idemsql.Postgres {
		return `consumer_key IN (SELECT key FROM ` + demoTable + `_consumers WHERE name = ?)`
	}
	return `consumer = ?`
}

// Package riverexample shows River workers (github.com/riverqueue/river on
// PostgreSQL through riverdriver/riverpgxv5) whose effects happen once
// although River runs a job again after an error, a timeout or a crash of
// the process that held it (its rescuer retries a job left running), and
// although the same payment may be enqueued as more than one job.
//
// Two workers, one per kind of effect (docs/river.md in idem's repository
// walks through them):
//
//   - [LedgerWorker]: the effect is a row in the application's own
//     PostgreSQL. idem's record (transactional mode, store/idempgxv5), the
//     ledger row and River's completion of the job
//     ([river.JobCompleteTx]) are written in one transaction of the job's
//     database: they commit together or not at all. A crash before the
//     commit leaves nothing; River runs the job again. A second job for
//     the same payment is a Duplicate and completes without writing.
//   - [ChargeWorker]: the effect is a call to an outside service (a
//     payment provider) that no transaction can take back. idem's lease
//     mode holds the payment while the call runs, passes the provider an
//     idempotency key that every attempt of the payment shares
//     ([idem.Attempt.Key]), and records the provider's answer as a
//     recovery point ([idem.Attempt.Step]): an attempt after a crash either
//     finds the answer recorded and does not call again, or calls again
//     with the same key, which the provider answers from its own record.
//
// The message ID idem deduplicates on is the payment's ID, not River's job
// ID: River's job IDs differ between two jobs enqueued for one payment.
package riverexample

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// PaymentArgs is a job's arguments: one payment to book or to charge.
type PaymentArgs struct {
	// PaymentID identifies the payment; idem deduplicates on it.
	PaymentID string `json:"payment_id"`
	// AmountCents is the amount in cents.
	AmountCents int64 `json:"amount_cents"`
}

// LedgerArgs is a job that books a payment in the ledger table.
type LedgerArgs struct{ PaymentArgs }

// Kind is River's name for the job kind.
func (LedgerArgs) Kind() string { return "idem_ledger" }

// ChargeArgs is a job that charges a payment at the provider.
type ChargeArgs struct{ PaymentArgs }

// Kind is River's name for the job kind.
func (ChargeArgs) Kind() string { return "idem_charge" }

// message is the idem message of a payment: its ID and, as payload, the
// arguments, so that the same payment ID with another amount is a
// FingerprintMismatch instead of a silent Duplicate.
func message(p PaymentArgs) (idem.Message, error) {
	body, err := json.Marshal(p)
	return idem.Message{ID: "payment-" + p.PaymentID, Payload: body}, err
}

// LedgerSchema creates the table LedgerWorker writes: one row per booked
// payment. It has no unique key on purpose, so that a payment booked twice
// would show as two rows.
const LedgerSchema = `CREATE TABLE IF NOT EXISTS ledger (
	payment_id   text NOT NULL,
	amount_cents bigint NOT NULL,
	job_id       bigint NOT NULL
)`

// Migrate creates, in the schema pool's connections use (search_path),
// River's tables (rivermigrate, up to its latest version), idem's
// (store.Migrate) and the ledger (LedgerSchema). Each step is idempotent.
func Migrate(ctx context.Context, pool *pgxpool.Pool, store *idempgxv5.Store) error {
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river's migrations: %w", err)
	}
	if err := store.Migrate(ctx); err != nil {
		return fmt.Errorf("idem's migrations: %w", err)
	}
	if _, err := pool.Exec(ctx, LedgerSchema); err != nil {
		return fmt.Errorf("the ledger table: %w", err)
	}
	return nil
}

// LedgerWorker books each payment once: idem's claim, the ledger row and
// River's job completion share one transaction of Pool. Consumer must be
// an idem.Consumer over an idempgxv5 store on the same database as River's
// tables.
type LedgerWorker struct {
	river.WorkerDefaults[LedgerArgs]
	Pool     *pgxpool.Pool
	Consumer *idem.Consumer[pgx.Tx]

	// pause, when set (tests only), is called with the payment's ID after
	// the ledger row is written and before the commit.
	pause func(paymentID string)
}

// Work runs one attempt of the job. A Duplicate completes the job without
// a second ledger row; an error rolls back the claim, the row and the
// completion together, and River retries the job (see riverError).
func (w *LedgerWorker) Work(ctx context.Context, job *river.Job[LedgerArgs]) error {
	msg, err := message(job.Args.PaymentArgs)
	if err != nil {
		return river.JobCancel(err)
	}
	tx, err := w.Pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) // after Commit: a no-op
	out, err := w.Consumer.ProcessTx(ctx, tx, msg, func(ctx context.Context, tx pgx.Tx, _ idem.Message) error {
		if _, err := tx.Exec(ctx, `INSERT INTO ledger (payment_id, amount_cents, job_id) VALUES ($1, $2, $3)`,
			job.Args.PaymentID, job.Args.AmountCents, job.ID); err != nil {
			return err
		}
		if w.pause != nil {
			w.pause(job.Args.PaymentID)
		}
		return nil
	})
	if err != nil {
		return riverError(out, err)
	}
	if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// Provider is the outside service ChargeWorker calls: it must make a
// request carrying an idempotency key it has seen answer with the first
// request's result, as payment providers do.
type Provider interface {
	// Charge charges the payment and returns the provider's charge ID.
	Charge(ctx context.Context, idempotencyKey string, p PaymentArgs) (chargeID string, err error)
}

// ChargeWorker charges each payment once at Provider, in idem's lease mode
// (Consumer is an idem.LeaseConsumer, e.g. over store/idempgxv5).
type ChargeWorker struct {
	river.WorkerDefaults[ChargeArgs]
	Consumer *idem.LeaseConsumer
	Provider Provider

	// pause, when set (tests only), is called with the payment's ID after
	// the provider answered and before the answer is recorded.
	pause func(paymentID string)
}

// Work runs one attempt of the job: the charge is a recovery point named
// "charge", made with the key idem derives from the consumer, the payment
// and the step, so every attempt for the payment sends the same key. The
// job's result is the charge ID.
func (w *ChargeWorker) Work(ctx context.Context, job *river.Job[ChargeArgs]) error {
	msg, err := message(job.Args.PaymentArgs)
	if err != nil {
		return river.JobCancel(err)
	}
	out, err := w.Consumer.Process(ctx, msg, func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
		id, err := a.Step(ctx, "charge", func(ctx context.Context) ([]byte, error) {
			id, err := w.Provider.Charge(ctx, a.Key("charge"), job.Args.PaymentArgs)
			if err == nil && w.pause != nil {
				w.pause(job.Args.PaymentID)
			}
			return []byte(id), err
		})
		return idem.Result{Body: id, ContentType: "text/plain"}, err
	})
	return riverError(out, err)
}

// riverError maps an idem outcome to what a River worker returns, by the
// rules every broker adapter follows (idem.Outcome.Settle): nil for an
// Ack (Processed, Duplicate: the job completes); a snooze for InProgress
// (another attempt holds the payment's lease: River runs the job again
// after RetryAfter without counting an attempt); a cancel for a dead letter
// (fingerprint mismatch, poison, a permanent error, an invalid message: no
// retry can fix it, River keeps the error); the error otherwise, which
// River retries with its retry policy up to its MaxAttempts.
func riverError(out idem.Outcome, err error) error {
	if out.Err == nil {
		out.Err = err
	}
	s := out.Settle(0)
	switch {
	case s.Action == idem.Ack:
		return nil
	case s.Action == idem.DeadLetter:
		return river.JobCancel(s.Err)
	case out.Status == idem.InProgress:
		return river.JobSnooze(max(s.Delay, 100*time.Millisecond))
	}
	return s.Err
}

// HTTPProvider is a Provider over HTTP: it POSTs the payment as JSON to URL
// with the key in the Idempotency-Key header and reads the charge ID from
// the answer's "id" field (Stripe's convention).
type HTTPProvider struct {
	// URL is the charges endpoint.
	URL string
	// Client sends the requests. Defaults to http.DefaultClient.
	Client *http.Client
}

// ErrProvider is what HTTPProvider.Charge wraps when the provider answered
// other than 2xx, or without a charge ID.
var ErrProvider = errors.New("provider refused the charge")

// Charge implements Provider. A non-2xx answer is an error wrapping
// ErrProvider with the status; the job is retried.
func (p HTTPProvider) Charge(ctx context.Context, key string, args PaymentArgs) (string, error) {
	body, err := json.Marshal(args)
	if err != nil {
		return "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.URL, bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	c := p.Client
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return "", err
	}
	if resp.StatusCode/100 != 2 {
		return "", fmt.Errorf("%w: %s", ErrProvider, resp.Status)
	}
	var charge struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(data, &charge); err != nil || charge.ID == "" {
		return "", fmt.Errorf("%w: no charge id in the answer", ErrProvider)
	}
	return charge.ID, nil
}

// NewWorkers registers both workers with River.
func NewWorkers(ledger *LedgerWorker, charge *ChargeWorker) *river.Workers {
	workers := river.NewWorkers()
	river.AddWorker(workers, ledger)
	river.AddWorker(workers, charge)
	return workers
}

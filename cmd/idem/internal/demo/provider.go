//go:build !nodemo

package demo

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"

	"github.com/idem-go/idem/store/idemsql"
)

// provider is the demo's fake payment provider: a third party outside the
// consumer's transaction, with its own database file, that deduplicates
// charges by the idempotency key the caller sends, as Stripe does. A call
// made before a consumer crash still happened; the redelivery sends the same
// key (idem.DeriveKey) and gets the first charge back instead of a second.
type provider struct {
	db       *sql.DB
	requests atomic.Int64 // charge requests received, replays included
	replays  atomic.Int64 // requests answered with an earlier charge
	// receiptReplays counts receipt requests answered with an earlier
	// receipt (same key).
	receiptReplays atomic.Int64
}

func openProvider(ctx context.Context, path string) (*provider, error) {
	// synchronous NORMAL: in WAL mode a commit is written to the log
	// without waiting for its flush to the disk, so it survives the death
	// of the process (a crash, kill -9), which is what the demo plays,
	// but not that of the machine. The provider stands for a third party
	// whose durability is not what the demo shows; when the disk is busy,
	// waiting for a flush per charge and per receipt made the run several
	// times longer.
	// The stores of idem's consumers keep SQLite's default (FULL).
	db, err := sql.Open("sqlite", idemsql.SQLiteDSN(path)+"&_pragma=synchronous(NORMAL)")
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1) // one writer at a time: queue in the pool, not in SQLite's busy handler
	_, err = db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS charges (
		charge_id       INTEGER PRIMARY KEY,
		idempotency_key TEXT NOT NULL UNIQUE,
		payment_id      TEXT NOT NULL,
		amount_cents    INTEGER NOT NULL,
		created_at      TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now'))
	)`)
	if err == nil {
		// The receipts the provider sent (by email, say): one per key.
		_, err = db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS receipts (
		receipt_id      INTEGER PRIMARY KEY,
		idempotency_key TEXT NOT NULL UNIQUE,
		payment_id      TEXT NOT NULL
	)`)
	}
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("provider database %s: %w", path, err)
	}
	return &provider{db: db}, nil
}

// charge charges amountCents for paymentID once per idempotency key and
// returns the charge ID; a repeated key returns the first charge's ID.
func (p *provider) charge(ctx context.Context, key, paymentID string, amountCents int64) (int64, error) {
	p.requests.Add(1)
	res, err := p.db.ExecContext(ctx,
		`INSERT INTO charges (idempotency_key, payment_id, amount_cents) VALUES (?, ?, ?)
		 ON CONFLICT (idempotency_key) DO NOTHING`, key, paymentID, amountCents)
	if err != nil {
		return 0, fmt.Errorf("provider: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		p.replays.Add(1)
	}
	var id int64
	err = p.db.QueryRowContext(ctx, `SELECT charge_id FROM charges WHERE idempotency_key = ?`, key).Scan(&id)
	return id, err
}

// totals returns the provider's charge count and the number of charges
// beyond the first for any payment (double charges).
func (p *provider) totals(ctx context.Context) (charges, doubles int64, err error) {
	err = p.db.QueryRowContext(ctx,
		`SELECT count(*), count(*) - count(DISTINCT payment_id) FROM charges`).Scan(&charges, &doubles)
	return charges, doubles, err
}

func (p *provider) close() error { return p.db.Close() }

// receipt sends the receipt of paymentID once per idempotency key; a
// repeated key is answered with the earlier receipt and sends nothing.
func (p *provider) receipt(ctx context.Context, key, paymentID string) error {
	res, err := p.db.ExecContext(ctx,
		`INSERT INTO receipts (idempotency_key, payment_id) VALUES (?, ?) ON CONFLICT (idempotency_key) DO NOTHING`, key, paymentID)
	if err != nil {
		return fmt.Errorf("provider: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		p.receiptReplays.Add(1)
	}
	return nil
}

// receiptTotals returns the receipts sent, the receipts beyond the first
// for any payment (double receipts), and the payments with a receipt.
func (p *provider) receiptTotals(ctx context.Context) (sent, doubles, distinct int64, err error) {
	err = p.db.QueryRowContext(ctx, `SELECT count(*), count(DISTINCT payment_id) FROM receipts`).Scan(&sent, &distinct)
	return sent, sent - distinct, distinct, err
}

// reset forgets every charge and receipt (a fresh run on a kept folder).
func (p *provider) reset(ctx context.Context) error {
	for _, q := range []string{`DELETE FROM charges`, `DELETE FROM receipts`} {
		if _, err := p.db.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

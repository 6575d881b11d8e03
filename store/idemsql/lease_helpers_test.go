package idemsql_test

import (
	"context"
	"fmt"

	"github.com/idem-go/idem/store/idemsql"
)

// lockRecord locks consumer's record id in a transaction of its own
// (SELECT ... FOR UPDATE, by the whole key on MySQL so that it locks
// that row only) until unlock rolls it back.
func (e *env) lockRecord(ctx context.Context, consumer, id string) (unlock func() error, err error) {
	tx, err := e.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	var one int
	if err := tx.QueryRowContext(ctx, e.q(`SELECT 1 FROM `+e.table+` WHERE `+e.consumerIs()+` AND message_id = ? FOR UPDATE`), consumer, id).Scan(&one); err != nil {
		_ = tx.Rollback()
		return nil, fmt.Errorf("locking record %q of consumer %q: %w", id, consumer, err)
	}
	return tx.Rollback, nil
}

// expireLease ends the live lease of consumer's in_progress record id at
// the server's now (expiry is inclusive: a lease ending at now has run
// out), changing nothing else. An expired lease stays as it is. It fails
// when there is no in_progress record.
func (e *env) expireLease(ctx context.Context, consumer, id string) error {
	var set string
	switch e.dialect {
	case idemsql.Postgres:
		set = `lease_expires_at = LEAST(lease_expires_at, now())`
	case idemsql.MySQL:
		set = `lease_expires_at = IF(lease_expires_at > UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), lease_expires_at)`
	default:
		set = `lease_expires_at = MIN(lease_expires_at, ` + sqliteNowMicros + `)`
	}
	if _, err := e.db.ExecContext(ctx, e.q(`UPDATE `+e.table+` SET `+set+` WHERE `+e.consumerIs()+` AND message_id = ? AND state = 1`), consumer, id); err != nil {
		return err
	}
	// Rows affected would not do: MySQL counts only changed rows unless
	// clientFoundRows is set.
	var n int
	if err := e.db.QueryRowContext(ctx, e.q(`SELECT COUNT(*) FROM `+e.table+` WHERE `+e.consumerIs()+` AND message_id = ? AND state = 1`), consumer, id).Scan(&n); err != nil {
		return err
	}
	if n != 1 {
		return fmt.Errorf("no in_progress record %q of consumer %q", id, consumer)
	}
	return nil
}

// sqliteNowMicros is SQLite's clock in Unix microseconds, as the store
// computes it.
const sqliteNowMicros = `(CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)`

// countSteps counts the recovery points of consumer's records.
func (e *env) countSteps(ctx context.Context, consumer string) (int, error) {
	var n int
	err := e.db.QueryRowContext(ctx, e.q(`SELECT COUNT(*) FROM `+e.table+`_steps WHERE consumer = ?`), consumer).Scan(&n)
	return n, err
}

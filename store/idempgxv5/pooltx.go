package idempgxv5

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// poolTx is a transaction that BeginClaim began on a connection it
// acquired from the pool: pgx's own transaction (pgx.Tx, every method of
// which is pgx's, LargeObjects and savepoint-based Begin included) whose
// Commit and Rollback also give the connection back to the pool, as a
// *pgxpool.Tx's do. BeginClaim holds the connection itself, rather than
// letting Pool.SendBatch hold it in a *pgxpool.Tx, so that a duplicate
// can end its transaction with the ROLLBACK pipelined after the read of
// the record and give the connection back without a statement more.
type poolTx struct {
	pgx.Tx
	c *pgxpool.Conn
}

// Commit commits the transaction and gives the connection back to the
// pool, which destroys it when its state is unknown.
func (t *poolTx) Commit(ctx context.Context) error {
	err := t.Tx.Commit(ctx)
	t.release()
	return err
}

// Rollback rolls the transaction back and gives the connection back to the
// pool. As with pgx's transactions, a Rollback after the transaction ended
// returns an error matching pgx.ErrTxClosed.
func (t *poolTx) Rollback(ctx context.Context) error {
	err := t.Tx.Rollback(ctx)
	t.release()
	return err
}

// release gives the connection back, once.
func (t *poolTx) release() {
	if t.c != nil {
		t.c.Release()
		t.c = nil
	}
}

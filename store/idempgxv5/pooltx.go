package idempgxv5

import (
	"context"
	"time"

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
	// d, when positive, bounds Commit and Rollback, and the Store's
	// EmitTx and EmitCommit (timed), by a deadline on the connection
	// (idemdriver.ClaimParams.CallTimeout; see Store.TimesCalls).
	d time.Duration
	// own is the transaction's outbox state, as Store.own holds it for
	// the other transactions the Store began (see Store.ownLoad); nil
	// once it ended.
	own any
}

// ownLoad returns the outbox state of tx (see Store.own) and whether tx
// is an open transaction this Store began: a BeginClaim transaction keeps
// it in itself, which spares a map entry per message.
func (s *Store) ownLoad(tx pgx.Tx) (any, bool) {
	if t, ok := tx.(*poolTx); ok {
		return t.own, t.own != nil
	}
	return s.own.Load(tx)
}

// ownStore sets the outbox state of tx, a transaction this Store began.
func (s *Store) ownStore(tx pgx.Tx, v any) {
	if t, ok := tx.(*poolTx); ok {
		t.own = v
		return
	}
	s.own.Store(tx, v)
}

// ownEnd forgets tx, a transaction that is ending, and returns its
// outbox state (nil for a transaction the Store did not begin).
func (s *Store) ownEnd(tx pgx.Tx) any {
	if t, ok := tx.(*poolTx); ok {
		v := t.own
		t.own = nil
		return v
	}
	v, _ := s.own.LoadAndDelete(tx)
	return v
}

// Commit commits the transaction and gives the connection back to the
// pool, which destroys it when its state is unknown.
func (t *poolTx) Commit(ctx context.Context) error {
	t.arm()
	err := t.Tx.Commit(ctx)
	t.release()
	return timedCallErr(ctx, t.d, err)
}

// Rollback rolls the transaction back and gives the connection back to the
// pool. As with pgx's transactions, a Rollback after the transaction ended
// returns an error matching pgx.ErrTxClosed.
func (t *poolTx) Rollback(ctx context.Context) error {
	t.arm()
	err := t.Tx.Rollback(ctx)
	t.release()
	return timedCallErr(ctx, t.d, err)
}

// arm sets the connection's deadline for one call, d from now, when the
// transaction has a call timeout and still holds its connection.
func (t *poolTx) arm() {
	if t.d > 0 && t.c != nil {
		setDeadline(t.c.Conn(), time.Now().Add(t.d))
	}
}

// disarm clears the deadline arm set, before the handler's statements or
// before the connection goes back to the pool.
func (t *poolTx) disarm() {
	if t.d > 0 && t.c != nil {
		setDeadline(t.c.Conn(), time.Time{})
	}
}

// release gives the connection back, once, its deadline cleared.
func (t *poolTx) release() {
	if t.c != nil {
		t.disarm()
		t.c.Release()
		t.c = nil
	}
}

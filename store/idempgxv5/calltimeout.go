package idempgxv5

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TimesCalls implements [idemdriver.CallTimer]: with
// idemdriver.ClaimParams.CallTimeout set, BeginClaim bounds itself, and
// the Commit, Rollback, EmitTx and EmitCommit of the transaction it
// returned, by a deadline on the connection (net.Conn.SetDeadline), set
// for the call and cleared after it, so that the handler's statements in
// between are not bounded. A call that runs past it fails with an error
// matching idemdriver.ErrStoreTimeout and pgx closes the connection (its
// state is unknown), which the pool then drops. pgx is then not handed a
// context that can be cancelled, which it would watch on every network
// call. True on the default layout; the partitioned layout's BeginClaim
// leaves the calls to ctx.
func (s *Store) TimesCalls() bool { return s.part == nil }

// acquireBy acquires a connection of the pool, waiting until deadline at
// most (a pool whose connections are all busy, a new connection that does
// not answer), and sets the deadline on the connection for the call that
// follows. The error of an acquisition cut short matches
// idemdriver.ErrStoreTimeout.
func (s *Store) acquireBy(ctx context.Context, deadline time.Time, d time.Duration) (*pgxpool.Conn, error) {
	var (
		c   *pgxpool.Conn
		err error
	)
	if ctx.Done() != nil {
		actx, cancel := context.WithDeadline(ctx, deadline)
		c, err = s.pool.Acquire(actx)
		cancel()
	} else {
		a := newAcquireCtx(ctx, deadline)
		c, err = s.pool.Acquire(a)
		a.free()
	}
	if err != nil {
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			err = storeTimeout(d, err)
		}
		return nil, err
	}
	setDeadline(c.Conn(), deadline)
	return c, nil
}

// acquireCtx is the context of one acquisition of acquireBy under a
// caller's context that cannot be cancelled: the caller's values, and a
// deadline. One whose timer has not fired is reused (acquireCtxs), so that
// a bounded acquisition allocates nothing: pgxpool and puddle read its
// Done and Err, and hand it (for its values) to the goroutines that
// connect or ping, which are done with it when Acquire returns a
// connection or an error other than the deadline's.
type acquireCtx struct {
	context.Context // the caller's, for Value
	deadline        time.Time
	done            chan struct{}
	timer           *time.Timer
	expired         atomic.Bool
}

// acquireCtxs holds acquireCtx values whose timer is stopped.
var acquireCtxs sync.Pool

// newAcquireCtx returns an acquireCtx with the values of ctx that ends at
// deadline.
func newAcquireCtx(ctx context.Context, deadline time.Time) *acquireCtx {
	a, _ := acquireCtxs.Get().(*acquireCtx)
	if a == nil {
		a = &acquireCtx{Context: ctx, deadline: deadline, done: make(chan struct{})}
		a.timer = time.AfterFunc(time.Until(deadline), a.expire)
		return a
	}
	a.Context, a.deadline = ctx, deadline
	a.timer.Reset(time.Until(deadline))
	return a
}

// free stops a's timer and, when it had not fired, keeps a for reuse.
func (a *acquireCtx) free() {
	if a.timer.Stop() {
		a.Context = nil
		acquireCtxs.Put(a)
	}
}

func (a *acquireCtx) expire() {
	a.expired.Store(true)
	close(a.done)
}

// Deadline implements context.Context.
func (a *acquireCtx) Deadline() (time.Time, bool) { return a.deadline, true }

// Done implements context.Context.
func (a *acquireCtx) Done() <-chan struct{} { return a.done }

// Err implements context.Context: context.DeadlineExceeded once the
// deadline passed.
func (a *acquireCtx) Err() error {
	if a.expired.Load() {
		return context.DeadlineExceeded
	}
	return nil
}

// setDeadline sets the deadline of c's network connection: a read or
// write past it fails. The zero time clears it. An error (the connection
// is closed) leaves nothing to bound.
func setDeadline(c *pgx.Conn, t time.Time) {
	_ = c.PgConn().Conn().SetDeadline(t)
}

// storeTimeout marks err, the error of a call given d, as the store
// timeout's.
func storeTimeout(d time.Duration, err error) error {
	return fmt.Errorf("%w (after %v): %w", idemdriver.ErrStoreTimeout, d, err)
}

// timedCallErr is err of a call bounded by d on the connection's deadline
// (d zero: not bounded), marked as the store timeout's when the deadline
// cut the call short (a network timeout that ctx did not cause: pgx then
// reports the context's error instead).
func timedCallErr(ctx context.Context, d time.Duration, err error) error {
	if d > 0 && err != nil && ctx.Err() == nil && errors.Is(err, os.ErrDeadlineExceeded) {
		return storeTimeout(d, err)
	}
	return err
}

// timed runs fn, a call on tx, bounded by tx's call timeout when tx is a
// transaction that BeginClaim began with one (see TimesCalls).
func timed(ctx context.Context, tx pgx.Tx, fn func() error) error {
	t, ok := tx.(*poolTx)
	if !ok || t.d <= 0 {
		return fn()
	}
	t.arm()
	err := fn()
	t.disarm()
	return timedCallErr(ctx, t.d, err)
}

package idem

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/lastval"
)

// Store deadlines
//
// Every store call the core makes is bounded by Config.StoreTimeout: a
// connection that stops answering (a half-open TCP connection, a
// black-holed network) fails the call with an error matching ErrStore and
// ErrStoreTimeout after that long, instead of holding the delivery until
// the broker's handler timeout. The handler's own work is bounded by the
// caller's context only.
//
// database/sql ties a transaction to the context it began with (it rolls
// back when that context ends, and its drivers commit under it), so a
// transaction's context must outlive the handler. The core therefore
// gives Begin, the claim, Commit and Rollback one context per
// transaction (txBound) whose deadline it arms around each of those calls
// and disarms while the handler runs. A store that bounds those calls
// itself (idemdriver.CallTimer: a deadline on its connection) gets the
// caller's context as it is, and so does every store when there is no
// store timeout: no context and no timer per transaction.

// ErrStoreTimeout means a store call ran past Config.StoreTimeout (or
// PurgeParams.StoreTimeout) and was cancelled: the connection stalled or
// the database was too slow. It comes with ErrStore. Retryable: nothing
// was acknowledged, and a transaction cut short rolls back (or, for a
// Commit, its outcome is unknown and the redelivery finds out).
var ErrStoreTimeout = idemdriver.ErrStoreTimeout

// ErrLockTimeout means a claim waited longer than its lock timeout (half
// of Config.StoreTimeout) for another transaction holding the same
// message's record: a concurrent copy still running, or a session that
// stalled with the record locked. The outcome is InProgress (an error
// matching ErrInProgress and ErrLockTimeout): redeliver later, never ack.
var ErrLockTimeout = idemdriver.ErrLockTimeout

// DefaultStoreTimeout is the default Config.StoreTimeout: well below the
// broker adapters' handler timeouts and ack deadlines (minutes), above a
// healthy store's slowest call.
const DefaultStoreTimeout = 10 * time.Second

// lockTimeout is the claims' lock timeout for a store timeout d: half of
// it, so the database ends a lock wait (keeping the connection) before
// the deadline cancels the call (which costs the connection).
func lockTimeout(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d / 2
}

// storeTimeout is the configured bound of one store call, or 0 for none.
func (c *core) storeTimeout() time.Duration { return max(c.cfg.StoreTimeout, 0) }

// callCtx returns a context for one store call: ctx bounded by the store
// timeout d (none when d is 0), with cause ErrStoreTimeout.
func callCtx(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeoutCause(ctx, d, timeoutCause(d))
}

// detachedCallCtx is callCtx for a call that must run even though ctx
// has ended (a rollback, the final write of a lease-mode result), bounded
// by d, or by finishTimeout when there is no store timeout.
func detachedCallCtx(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		d = finishTimeout
	}
	return callCtx(withoutCancel(ctx), d)
}

// withoutCancel is context.WithoutCancel(ctx), or ctx itself when it
// cannot be cancelled (no Done channel, hence no deadline either): one
// context fewer on the paths that detach a final write from the caller.
func withoutCancel(ctx context.Context) context.Context {
	if ctx.Done() == nil {
		return ctx
	}
	return context.WithoutCancel(ctx)
}

func timeoutCause(d time.Duration) error {
	// Every call of a consumer has the same store timeout: reuse the last
	// cause built (an error value is immutable) instead of formatting one
	// per call.
	return timeoutCauses.Get(d, func(d time.Duration) error { return fmt.Errorf("%w (after %v)", ErrStoreTimeout, d) })
}

// timeoutCauses is the last cause timeoutCause built.
var timeoutCauses lastval.Cache[time.Duration, error]

// timedOut returns err marked with the store timeout's cause when ctx
// ended because of it, and err otherwise.
func timedOut(ctx context.Context, err error) error {
	if err == nil || errors.Is(err, ErrStoreTimeout) {
		return err
	}
	if cause := context.Cause(ctx); ctx.Err() != nil && errors.Is(cause, ErrStoreTimeout) {
		return fmt.Errorf("%w: %w", cause, err)
	}
	return err
}

// txBound is the context of one transaction's store calls (see the
// comment at the top of this file): ctx is derived from the caller's and
// is cancelled, with cause ErrStoreTimeout, when a call made between arm
// and disarm runs past the store timeout. A txBound is used by one
// goroutine.
type txBound struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	d      time.Duration
	// timer cancels ctx when it fires; made by the first arm and reset
	// by the next ones, so a transaction's calls share one timer.
	timer *time.Timer
	// selfTimed: the store bounds the transaction's calls itself
	// (idemdriver.CallTimer), and ctx is the caller's.
	selfTimed bool
}

// newTxBound returns the txBound of a transaction begun under ctx.
func (c *core) newTxBound(ctx context.Context) *txBound {
	b := &txBound{}
	c.initTxBound(b, ctx)
	return b
}

// initTxBound makes b the txBound of a transaction begun under ctx, for a
// caller that holds b in something it allocates anyway.
func (c *core) initTxBound(b *txBound, ctx context.Context) {
	d := c.storeTimeout()
	if d == 0 {
		// Nothing to bound: the calls run under the caller's context.
		*b = txBound{ctx: ctx}
		return
	}
	bctx, cancel := context.WithCancelCause(ctx)
	*b = txBound{ctx: bctx, cancel: cancel, d: d}
}

// initSelfTimed makes b the txBound of a transaction begun under ctx on a
// store that bounds the transaction's calls itself (idemdriver.CallTimer,
// given the store timeout in ClaimParams.CallTimeout): the calls run
// under ctx as it is, and b arms nothing.
func initSelfTimed(b *txBound, ctx context.Context) {
	*b = txBound{ctx: ctx, selfTimed: true}
}

// arm starts the deadline of one store call.
func (b *txBound) arm() {
	switch {
	case b.d <= 0:
	case b.timer == nil:
		b.timer = time.AfterFunc(b.d, b.expire)
	default:
		b.timer.Reset(b.d)
	}
}

// expire cancels ctx with the store timeout's cause: the armed call ran
// past it.
func (b *txBound) expire() { b.cancel(timeoutCause(b.d)) }

// disarm stops the deadline.
func (b *txBound) disarm() {
	if b.timer != nil {
		b.timer.Stop()
	}
}

// call runs fn under the armed deadline and returns its error, marked
// with ErrStoreTimeout when the deadline cut it short. A call may return
// nil just as the deadline passes: see usable.
func (b *txBound) call(fn func(ctx context.Context) error) error {
	b.arm()
	err := fn(b.ctx)
	b.disarm()
	return timedOut(b.ctx, err)
}

// usable returns nil while ctx is live, and otherwise the error of a
// transaction that can no longer be used (database/sql rolls back a
// transaction whose context ended): the deadline passed just as a call
// returned, or the caller's context ended.
func (b *txBound) usable() error {
	if b.ctx.Err() == nil {
		return nil
	}
	return timedOut(b.ctx, context.Cause(b.ctx))
}

// end releases the context once the transaction has ended.
func (b *txBound) end() {
	b.disarm()
	if b.cancel != nil {
		b.cancel(context.Canceled)
	}
}

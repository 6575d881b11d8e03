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
// gives Begin, the claim and Commit a context of the transaction's
// (txBound, txbound.go) whose deadline it arms around each of those calls
// and disarms while the handler runs, and Rollback a second one that the
// caller's cancellation does not end. Both, and the timer, are reused from
// one transaction to the next: they end with the caller's context through
// a context.AfterFunc link, not by deriving from it, and that link too is
// kept while the transactions come under one long-lived context, so a
// transaction allocates nothing for its deadlines (a context given per
// message costs its link, two allocations). A store that bounds those calls itself
// (idemdriver.CallTimer: a deadline on its connection) gets the caller's
// context as it is, and so does every store when there is no store
// timeout: no context and no timer per transaction.

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

// deadlineLag bounds how long timedOut waits for a context whose
// deadline passed to end: its timer is due, so it ends at once unless
// the machine is starved, or the context is not one that ends at its
// deadline (the error is then returned unmarked).
const deadlineLag = time.Second

// timeoutCauses is the last cause timeoutCause built.
var timeoutCauses lastval.Cache[time.Duration, error]

// timedOut returns err marked with the store timeout's cause when ctx
// ended because of it, and err otherwise. A call that failed with
// context.DeadlineExceeded once ctx's deadline passed, ctx not yet ended,
// was ended by a context the store derived from ctx's deadline alone (a
// layer that batches calls keeps their deadlines, not their
// cancellation): timedOut then waits, at most deadlineLag, for ctx's own
// timer, which is due, to say whether that deadline was the store
// timeout's.
func timedOut(ctx context.Context, err error) error {
	if err == nil || errors.Is(err, ErrStoreTimeout) {
		return err
	}
	if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
		if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
			t := time.NewTimer(deadlineLag)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
	}
	if cause := context.Cause(ctx); ctx.Err() != nil && errors.Is(cause, ErrStoreTimeout) {
		return fmt.Errorf("%w: %w", cause, err)
	}
	return err
}

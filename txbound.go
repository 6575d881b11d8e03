package idem

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// txBound is the context of one transaction's store calls (see the
// comment at the top of deadline.go). With a store timeout, ctx is the
// reusable context of a txCtxs taken from the Consumer's pool: ended with
// the caller's context, and with cause ErrStoreTimeout when a call made
// between arm and disarm runs past the store timeout. A txBound is used by
// one goroutine.
type txBound struct {
	ctx context.Context
	// l holds ctx, the rollback's detached context and the timer; nil
	// without a store timeout, for a self-timed store, and once released.
	l *txCtxs
	// selfTimed: the store bounds the transaction's calls itself
	// (idemdriver.CallTimer), and ctx is the caller's.
	selfTimed bool
}

// initTxBound makes b the txBound of a transaction begun under ctx. The
// caller ends it with end, deferred, after release on the paths where the
// transaction ended without a store error.
func (c *core) initTxBound(b *txBound, ctx context.Context) {
	d := c.storeTimeout()
	if d == 0 {
		// Nothing to bound: the calls run under the caller's context.
		*b = txBound{ctx: ctx}
		return
	}
	l := c.txFree.get()
	l.begin(ctx, d)
	*b = txBound{ctx: &l.bound, l: l}
}

// initSelfTimed makes b the txBound of a transaction begun under ctx on a
// store that bounds the transaction's calls itself (idemdriver.CallTimer,
// given the store timeout in ClaimParams.CallTimeout): the calls run
// under ctx as it is, and b arms nothing.
func initSelfTimed(b *txBound, ctx context.Context) {
	*b = txBound{ctx: ctx, selfTimed: true}
}

// call runs fn under the armed deadline and returns its error, marked
// with ErrStoreTimeout when the deadline cut it short, or with the
// caller's cause when the caller's context ended during the call. A call
// may return nil just as the deadline passes: see usable.
func (b *txBound) call(fn func(ctx context.Context) error) error {
	if b.l == nil {
		return timedOut(b.ctx, fn(b.ctx))
	}
	b.l.arm(false)
	err := fn(b.ctx)
	b.l.disarm()
	return b.l.explain(err)
}

// detachedCall runs fn, a rollback, under a context the caller's
// cancellation does not end, bounded by the store timeout; the
// transaction's own context is armed too, since database/sql drivers roll
// back under the context the transaction began with. It needs a store
// timeout (b.l non-nil).
func (b *txBound) detachedCall(fn func(ctx context.Context) error) error {
	b.l.arm(true)
	err := fn(&b.l.detached)
	b.l.disarm()
	return timedOut(&b.l.detached, err)
}

// usable returns nil while ctx is live, and otherwise the error of a
// transaction that can no longer be used (database/sql rolls back a
// transaction whose context ended): the deadline passed just as a call
// returned, or the caller's context ended.
func (b *txBound) usable() error {
	if b.l != nil {
		b.l.checkCaller()
	}
	if b.ctx.Err() == nil {
		return nil
	}
	return timedOut(b.ctx, context.Cause(b.ctx))
}

// release is called once the transaction ended (committed, rolled back,
// or ended by the store) without a store error: b's contexts go back to
// the pool for the next transaction. b is not used after it.
func (b *txBound) release() {
	if b.l != nil {
		b.l.release()
		b.l, b.ctx = nil, nil
	}
}

// end, deferred by whoever began the transaction, ends ctx unless
// release kept it for reuse: after a panic or a store error the
// transaction may still be open, and a database/sql transaction is rolled
// back when its context ends.
func (b *txBound) end() {
	if b.l != nil {
		b.l.abandon()
		b.l = nil
	}
}

// txFreeList holds the txCtxs of ended transactions for the next ones
// (core.txFree), so a transaction allocates no context, cancel function
// or timer of its own, and database/sql's BeginTx registers its
// transaction's context with a parent whose Done channel and children map
// already exist. It is the Consumer's, not the process's (a Consumer made
// in a testing/synctest bubble keeps its timers and channels in it), and
// a list, not a sync.Pool: a txCtxs may stay linked to a long-lived
// caller's context between transactions (see begin), and one dropped by
// the garbage collector's pool clean-up would stay registered with that
// context. It holds at most maxFreeTxCtxs.
type txFreeList struct {
	mu     sync.Mutex
	list   []*txCtxs
	closed bool
}

// maxFreeTxCtxs bounds a txFreeList: more transactions than this at once
// allocate the contexts of those above it.
const maxFreeTxCtxs = 256

// get returns a txCtxs from the list, or a new one.
func (f *txFreeList) get() *txCtxs {
	f.mu.Lock()
	if n := len(f.list); n > 0 {
		l := f.list[n-1]
		f.list[n-1] = nil
		f.list = f.list[:n-1]
		f.mu.Unlock()
		return l
	}
	f.mu.Unlock()
	return newTxCtxs(f)
}

// put keeps l for the next transaction, and reports whether it did (not
// when the list is full or the Consumer closed).
func (f *txFreeList) put(l *txCtxs) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed || len(f.list) >= maxFreeTxCtxs {
		return false
	}
	f.list = append(f.list, l)
	return true
}

// close unlinks the txCtxs kept from their callers' contexts and keeps
// none from now on: Consumer.Close.
func (f *txFreeList) close() {
	f.mu.Lock()
	list := f.list
	f.list, f.closed = nil, true
	f.mu.Unlock()
	for _, l := range list {
		l.unlinkCaller()
	}
}

// txCtxs are the contexts and the timer behind a txBound: bound, under
// which the transaction begins, claims and commits, and detached, under
// which it rolls back. Both are reusableCtx, so they outlive one
// transaction (see txFreeList). mu orders the timer's and the caller
// link's goroutines with the transaction's own.
type txCtxs struct {
	bound, detached reusableCtx
	free            *txFreeList // the Consumer's, where release puts l

	mu sync.Mutex
	// armed says which contexts the timer ends when it fires: 0 none,
	// armBound, armBoth (a rollback's).
	armed    uint8
	deadline time.Time // of the armed call
	d        time.Duration
	// caller is the context the transaction began under (nil between
	// transactions); callerDone its Done channel, nil when it cannot end.
	caller     context.Context
	callerDone <-chan struct{}

	timer       *time.Timer // calls expire; made by the first arm
	expireFn    func()      // l.expire, made once
	callerEndFn func()      // l.callerEnded, made once
	// unlink stops the context.AfterFunc that ends bound when the context
	// whose Done channel is linkDone ends; nil when there is none. The
	// link outlives a transaction when keepLink is set: the caller's
	// Done channel was the last transaction's too (one long-lived
	// context, as a worker loop's), so the next transaction under it
	// needs no link of its own. lastDone is the last transaction's.
	unlink             func() bool
	linkDone, lastDone <-chan struct{}
	keepLink           bool
}

const (
	armBound = 1 + iota
	armBoth
)

func newTxCtxs(free *txFreeList) *txCtxs {
	l := &txCtxs{free: free}
	l.bound.done, l.bound.cancel = context.WithCancelCause(context.Background())
	l.detached.done, l.detached.cancel = context.WithCancelCause(context.Background())
	l.detached.detached = true
	l.expireFn, l.callerEndFn = l.expire, l.callerEnded
	return l
}

// begin readies l for a transaction begun under caller, bounding its calls
// by d.
func (l *txCtxs) begin(caller context.Context, d time.Duration) {
	l.mu.Lock()
	l.bound.renew(caller)
	l.detached.renew(caller)
	l.d, l.caller, l.callerDone = d, caller, caller.Done()
	l.mu.Unlock()
	if l.callerDone == nil {
		return
	}
	if caller.Err() != nil {
		l.callerEnded()
		return
	}
	if l.unlink == nil || l.linkDone != l.callerDone {
		// One context and its stop function: what
		// context.WithCancelCause(caller) cost per transaction before,
		// without the context of its own that database/sql's transaction
		// then registered with. A link to the same Done channel, kept
		// from an earlier transaction, ends bound on the same event
		// (callerEnded reads the current caller's error).
		l.unlinkCaller()
		l.unlink, l.linkDone = context.AfterFunc(caller, l.callerEndFn), l.callerDone
	}
	l.keepLink = l.callerDone == l.lastDone
	l.lastDone = l.callerDone
}

// callerEnded ends bound with the caller's error and cause, as a context
// derived from the caller's would end. It runs in context.AfterFunc's
// goroutine, or in checkCaller; a run left over from an earlier
// transaction finds a caller that has not ended (or none) and does
// nothing.
func (l *txCtxs) callerEnded() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.caller == nil {
		return
	}
	if err := l.caller.Err(); err != nil {
		l.bound.end(err, context.Cause(l.caller))
	}
}

// checkCaller ends bound now if the caller's context has ended and the
// AfterFunc's goroutine has not ended it yet, so that every call and
// check starts from the caller's state as it is.
func (l *txCtxs) checkCaller() {
	if l.callerDone == nil {
		return
	}
	select {
	case <-l.callerDone:
		l.callerEnded()
	default:
	}
}

// arm starts the deadline of one store call: of bound's, or of both
// contexts' for a rollback.
func (l *txCtxs) arm(both bool) {
	l.checkCaller()
	l.mu.Lock()
	l.armed = armBound
	l.deadline = time.Now().Add(l.d)
	if both {
		l.armed = armBoth
		l.detached.deadline = l.deadline
	}
	l.mu.Unlock()
	if l.timer == nil {
		l.timer = time.AfterFunc(l.d, l.expireFn)
	} else {
		l.timer.Reset(l.d)
	}
}

// disarm stops the deadline.
func (l *txCtxs) disarm() {
	l.timer.Stop()
	l.mu.Lock()
	l.armed = 0
	l.detached.deadline = time.Time{}
	l.mu.Unlock()
}

// expire ends the armed contexts with the store timeout's cause: the
// armed call ran past it. A firing that comes after its call was
// disarmed, or before the deadline of the call armed since, does nothing.
func (l *txCtxs) expire() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.armed == 0 || time.Now().Before(l.deadline) {
		return
	}
	cause := timeoutCause(l.d)
	l.bound.end(context.Canceled, cause)
	if l.armed == armBoth {
		l.detached.end(context.Canceled, cause)
	}
}

// explain returns err, the error of a call made under bound, marked with
// the store timeout's cause when the deadline cut the call short, or with
// the caller's cause when the caller's context ended (database/sql then
// reports context.Canceled, which a caller whose deadline passed would
// not recognise).
func (l *txCtxs) explain(err error) error {
	if err == nil {
		return nil
	}
	if err = timedOut(&l.bound, err); errors.Is(err, ErrStoreTimeout) || l.callerDone == nil {
		return err
	}
	if cerr := l.caller.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%w: %w", context.Cause(l.caller), err)
	}
	return err
}

// release puts l back in the free list: the transaction ended, and with
// it what the store derived from bound (database/sql's transaction
// context, which its Commit and Rollback cancel). The link to the
// caller's context stays when keepLink says the next transaction is
// likely to come under the same one; a context given per message (a
// broker adapter's, which it cancels once the message is settled) is
// unlinked at once, so its end starts no goroutine. A txCtxs whose
// contexts ended (the caller's ended just after the commit) is left to
// the garbage collector instead: a context never starts again, and
// replacing its parts would race with a driver's goroutine still looking
// at them.
func (l *txCtxs) release() {
	if !l.keepLink {
		l.unlinkCaller()
	}
	l.mu.Lock()
	l.caller, l.callerDone = nil, nil
	// Nothing of the caller's is kept alive by l while it waits, but the
	// context a kept link was made with.
	l.bound.values, l.detached.values = context.Background(), context.Background()
	reusable := l.bound.done.Err() == nil && l.detached.done.Err() == nil
	l.mu.Unlock()
	if !reusable || !l.free.put(l) {
		l.unlinkCaller()
	}
}

// abandon ends both contexts and leaves l to the garbage collector: the
// transaction may still be open, and ending bound makes database/sql roll
// it back.
func (l *txCtxs) abandon() {
	l.unlinkCaller()
	if l.timer != nil {
		l.timer.Stop()
	}
	l.mu.Lock()
	l.armed = 0
	l.caller, l.callerDone = nil, nil
	l.bound.end(context.Canceled, context.Canceled)
	l.detached.end(context.Canceled, context.Canceled)
	l.mu.Unlock()
}

// unlinkCaller stops the AfterFunc that follows the caller's context. A
// run of it already started finds l.caller nil, or the next
// transaction's, and leaves bound alone unless that one has ended.
func (l *txCtxs) unlinkCaller() {
	if l.unlink != nil {
		l.unlink()
		l.unlink, l.linkDone = nil, nil
	}
}

// reusableCtx is a context.Context of store calls that outlives one
// transaction, until it ends: its Done channel, Err and cancel cause are
// those of a context of its own (done, made from context.Background()),
// its values those of the caller's context. So a context derived from it
// (database/sql's transaction's) registers with done as with any
// cancellable context, at no allocation once done's children map and
// channel exist.
type reusableCtx struct {
	done   context.Context // set once, by newTxCtxs
	cancel context.CancelCauseFunc
	// detached: the rollback's, whose deadline is only that of its armed
	// call, not the caller's.
	detached bool
	// err is what Err returns once done has ended: the caller's error
	// when the caller's context ended it, else context.Canceled. Written
	// before done is cancelled.
	err error
	// values is the caller's context (context.Background() between
	// transactions).
	values context.Context
	// deadline is the detached context's armed call's deadline (zero when
	// no call is armed).
	deadline time.Time
}

// renew readies c, which has not ended, for a transaction begun under
// caller.
func (c *reusableCtx) renew(caller context.Context) {
	c.values = caller
	c.deadline = time.Time{}
}

// end ends c with err and cause, unless it has ended already.
func (c *reusableCtx) end(err, cause error) {
	if c.done.Err() != nil {
		return
	}
	c.err = err
	c.cancel(cause)
}

// Deadline implements context.Context.
func (c *reusableCtx) Deadline() (time.Time, bool) {
	if c.detached {
		return c.deadline, !c.deadline.IsZero()
	}
	return c.values.Deadline()
}

// Done implements context.Context.
func (c *reusableCtx) Done() <-chan struct{} { return c.done.Done() }

// Err implements context.Context.
func (c *reusableCtx) Err() error {
	if c.done.Err() == nil {
		return nil
	}
	return c.err
}

// Value implements context.Context: done answers the context package's
// own lookup (which finds the cancellable context to register with, and
// the cause); every other key is the caller's.
func (c *reusableCtx) Value(key any) any {
	if v := c.done.Value(key); v != nil {
		return v
	}
	return c.values.Value(key)
}

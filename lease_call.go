package idem

import (
	"container/heap"
	"context"
	"math"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem/idemdriver"
)

// callBound is the context of one or more store calls of a lease-mode
// message, bounded by Config.StoreTimeout without a timer or a context
// per call (callCtx): while a call runs, its deadline is in the
// consumer's renewal scheduler, whose one timer cancels the context, with
// cause ErrStoreTimeout, when the call outlasts it. A *callBound is the
// context the store is given: its Deadline is the running call's (the
// store timeout from the call's start, or the caller's deadline when that
// is sooner), so that a store, or a layer that batches calls and keeps
// only their deadlines (internal/leasebatch), bounds the call as the
// engine does. The Acquire's is made from the caller's context and its
// cancellable part becomes the attempt's Context once the message is
// held; the final write of Process has one of its own, detached from the
// caller. A context cancelled that way serves no later call (each then
// falls back to callCtx); so does one in use by another call of the same
// attempt.
type callBound struct {
	ctx    context.Context // derived from the caller's; cancelled on a timeout
	cancel context.CancelCauseFunc
	d      time.Duration
	busy   atomic.Bool // a call uses ctx
	// callDeadline is the running call's deadline in Unix nanoseconds (0
	// when no call runs), read by Deadline from the store's goroutines.
	callDeadline atomic.Int64
	// cp is the parameters of the final write made on ctx (Complete),
	// used only by the call that holds busy.
	cp idemdriver.CompleteParams
	// deadline is the running call's deadline and idx its place in
	// renewals.calls (-1 when not there); both guarded by renewals.mu.
	deadline time.Time
	idx      int
}

// init makes b's context, derived from parent, for calls bounded by d.
func (b *callBound) init(parent context.Context, d time.Duration) {
	b.ctx, b.cancel = context.WithCancelCause(parent)
	b.d, b.idx = d, -1
}

// Deadline implements context.Context: the running call's deadline, or
// the caller's when it is sooner or no call runs.
func (b *callBound) Deadline() (time.Time, bool) {
	dl, ok := b.ctx.Deadline()
	if n := b.callDeadline.Load(); n != 0 {
		if t := time.Unix(0, n); !ok || t.Before(dl) {
			return t, true
		}
	}
	return dl, ok
}

// Done implements context.Context: b.ctx's, so that a context derived
// from b registers with b.ctx as with any cancellable context.
func (b *callBound) Done() <-chan struct{} { return b.ctx.Done() }

// Err implements context.Context.
func (b *callBound) Err() error { return b.ctx.Err() }

// Value implements context.Context: b.ctx's values, among them the
// context package's own key that finds b.ctx to register with and its
// cause.
func (b *callBound) Value(key any) any { return b.ctx.Value(key) }

// maxCallDeadline is the latest deadline callDeadline holds (UnixNano's
// range ends in 2262): a call whose store timeout ends later (one of
// centuries, as a StoreTimeout of math.MaxInt64 for "no practical bound")
// reports it, instead of a time wrapped into the past that would end the
// store's own derived contexts at once.
var maxCallDeadline = time.Unix(0, math.MaxInt64)

// startCall starts a call on b's context, bounded by b.d from now, and
// reports whether it did: not when b was never made, when another call
// uses it or when an earlier call timed out (the caller then uses
// callCtx). A started call ends with endCall.
func (r *renewals) startCall(b *callBound) bool {
	if b == nil || b.ctx == nil || !b.busy.CompareAndSwap(false, true) {
		return false
	}
	if b.ctx.Err() != nil {
		b.busy.Store(false)
		return false
	}
	r.mu.Lock()
	b.deadline = time.Now().Add(b.d)
	n := int64(math.MaxInt64) // past what UnixNano holds: the latest it does
	if b.deadline.Before(maxCallDeadline) {
		n = b.deadline.UnixNano()
	}
	b.callDeadline.Store(n)
	heap.Push(&r.calls, b)
	r.arm()
	r.mu.Unlock()
	return true
}

// endCall ends the call started on b: its deadline leaves the scheduler
// (the timer is left armed: firing early finds nothing due).
func (r *renewals) endCall(b *callBound) {
	r.mu.Lock()
	if b.idx >= 0 {
		heap.Remove(&r.calls, b.idx)
	}
	r.mu.Unlock()
	b.callDeadline.Store(0)
	b.busy.Store(false)
}

// timeOut cancels the calls whose deadline is not after now; r.mu is
// held.
func (r *renewals) timeOut(now time.Time) {
	for len(r.calls) > 0 && !r.calls[0].deadline.After(now) {
		b := heap.Pop(&r.calls).(*callBound)
		b.cancel(timeoutCause(b.d))
	}
}

// callHeap is the running calls on callBound contexts, earliest
// deadline first.
type callHeap []*callBound

func (h callHeap) Len() int           { return len(h) }
func (h callHeap) Less(i, j int) bool { return h[i].deadline.Before(h[j].deadline) }
func (h callHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *callHeap) Push(x any) {
	b := x.(*callBound)
	b.idx = len(*h)
	*h = append(*h, b)
}
func (h *callHeap) Pop() any {
	old := *h
	b := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	b.idx = -1
	return b
}

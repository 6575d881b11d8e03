package idem

import (
	"container/heap"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/idem-go/idem/idemdriver"
)

// renewals is a LeaseConsumer's lease renewal scheduler: one timer for
// all the consumer's held attempts. It keeps every attempt's next event
// (its next renewal, every Lease/3 from the Acquire, or its local
// deadline) in a heap, and its timer (time.AfterFunc, created at the
// first attempt and reset, never reallocated) fires at the earliest. No
// goroutine waits for it: the runtime runs fire when it is due. Due
// renewals queue for at most maxRenewers goroutines, started when there
// are renewals to send and gone when there are none: many attempts coming
// due at once (thousands acquired in a burst) cost that many goroutines,
// not one each. A renewal in flight for longer than slowRenewal (Lease/100)
// while other renewals wait for a goroutine, or still in flight when its
// next tick comes (a stalled connection, a row another transaction holds
// locked), stops counting towards maxRenewers, so stalled calls do not
// hold back the renewals of the attempts whose store answers, however
// many of them came due first: goroutines are then at most maxRenewers
// plus the renewals stalled at once (at most one per held attempt). An
// attempt that ends before its
// first renewal (most do) costs no goroutine, timer or context, only its
// place in the heap.
//
// When the store renews in batches (idemdriver.BatchRenewer), the due
// renewals take another path (lease_renewals_batch.go): each firing sends
// the renewals due within renewWindow in batches of at most maxRenewBatch,
// one store round trip and one goroutine per batch, so 10,000 held
// attempts cost a few round trips per tick rather than 10,000, and a
// batch whose answer is slow holds back its own renewals only.
type renewals struct {
	mu    sync.Mutex
	q     renewalHeap
	timer *time.Timer // calls fire; nil before the first attempt
	at    time.Time   // when the timer fires; zero when it is not armed
	// ready is the due renewals not yet sent, oldest first (an attempt
	// removed meanwhile is skipped: its rs.queued is false); workers is
	// the goroutines sending them.
	ready   []*Attempt
	workers int
	// flying is the renewals in flight that count in workers, oldest
	// sent first: the ones that slowRenewal may stop counting.
	flying []*Attempt
	// calls is the store calls running on callBound contexts, whose
	// deadlines the same timer enforces.
	calls callHeap
	// batch is the consumer's store when it renews in batches; nil
	// otherwise (one Renew per renewal, on the workers above).
	batch idemdriver.LeaseBatchRenewer
}

// maxRenewers bounds the goroutines of a consumer's renewals in flight.
// A renewal is one short store call; a store serves no more at once than
// its connections, which are usually fewer.
const maxRenewers = 16

// slowRenewal is how long a renewal may be in flight before it stops
// counting towards maxRenewers when others wait: a hundredth of the lease
// (300ms at the default 30s), many store round trips, yet short enough
// that the renewals queued behind hundreds of stalled ones are sent well
// within the lease they extend (each slowRenewal frees maxRenewers more
// goroutines).
func slowRenewal(lease time.Duration) time.Duration { return lease / 100 }

// renewalState is an attempt's place in the scheduler, guarded by
// renewals.mu.
type renewalState struct {
	idx      int                // in the heap; -1 when not scheduled
	tick     time.Time          // the next renewal
	expiry   time.Time          // the next check of the local deadline
	inflight chan struct{}      // closed when the renewal queued or in flight returns
	ctx      context.Context    // the queued renewal's context
	cancel   context.CancelFunc // ends the renewal queued or in flight
	queued   bool               // in renewals.ready, not yet sent
	sent     time.Time          // when the renewal in flight was sent
	missed   bool               // a renewal came due while one was in flight
	// slow is set when a renewal came due while one was in flight (not
	// queued): that renewal's goroutine no longer counts in
	// renewals.workers, so another may start.
	slow    bool
	stopped bool
	// batch is the batch the renewal in flight rides in (store batches
	// only; inflight is then nil).
	batch *renewBatch
	// ending is set once the attempt's ending write (Complete, Release)
	// was sent: a renewal that then finds the lease gone may be seeing
	// that write, landed with its reply lost, so it stops the renewals
	// without taking the attempt as lost; the ending write's own answer,
	// or its retry's, decides.
	ending bool
}

// due is the attempt's next event.
func (s *renewalState) due() time.Time {
	if s.expiry.Before(s.tick) {
		return s.expiry
	}
	return s.tick
}

type renewalHeap []*Attempt

func (h renewalHeap) Len() int           { return len(h) }
func (h renewalHeap) Less(i, j int) bool { return h[i].rs.due().Before(h[j].rs.due()) }
func (h renewalHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].rs.idx, h[j].rs.idx = i, j
}
func (h *renewalHeap) Push(x any) {
	a := x.(*Attempt)
	a.rs.idx = len(*h)
	*h = append(*h, a)
}
func (h *renewalHeap) Pop() any {
	old := *h
	a := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	a.rs.idx = -1
	return a
}

// add schedules a's renewals: the first Lease/3 after start, its local
// deadline at a.validUntil.
func (r *renewals) add(a *Attempt, start time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a.rs = renewalState{idx: -1, tick: start.Add(a.c.cfg.Lease / 3), expiry: a.validUntil}
	heap.Push(&r.q, a)
	r.arm()
}

// arm sets the timer to the earliest event (a renewal, a local deadline
// or a store call's deadline), unless it already fires no later (an early
// firing finds nothing due and arms again); r.mu is held.
func (r *renewals) arm() {
	var due time.Time
	if len(r.q) > 0 {
		due = r.q[0].rs.due()
	}
	if len(r.calls) > 0 && (due.IsZero() || r.calls[0].deadline.Before(due)) {
		due = r.calls[0].deadline
	}
	if slow, ok := r.nextSlow(); ok && (due.IsZero() || slow.Before(due)) {
		due = slow
	}
	if due.IsZero() {
		if !r.at.IsZero() {
			r.timer.Stop()
			r.at = time.Time{}
		}
		return
	}
	if !r.at.IsZero() && !due.Before(r.at) {
		return
	}
	if r.timer == nil {
		r.timer = time.AfterFunc(time.Until(due), r.fire)
	} else {
		r.timer.Reset(time.Until(due))
	}
	r.at = due
}

// nextSlow is when the oldest renewal in flight that counts towards
// maxRenewers becomes slow (slowRenewal), if renewals wait for a
// goroutine meanwhile; r.mu is held.
func (r *renewals) nextSlow() (time.Time, bool) {
	if len(r.ready) == 0 || r.workers < maxRenewers || len(r.flying) == 0 {
		return time.Time{}, false
	}
	a := r.flying[0]
	return a.rs.sent.Add(slowRenewal(a.c.cfg.Lease)), true
}

// uncount stops a's renewal in flight from counting towards maxRenewers
// (renewalState.slow); r.mu is held.
func (r *renewals) uncount(a *Attempt) {
	a.rs.slow = true
	r.workers--
	r.unfly(a)
}

// unfly removes a from r.flying; r.mu is held.
func (r *renewals) unfly(a *Attempt) {
	for i, f := range r.flying {
		if f == a {
			r.flying = append(r.flying[:i], r.flying[i+1:]...)
			r.flying[len(r.flying):cap(r.flying)][0] = nil
			return
		}
	}
}

// ending notes that a's ending write is being sent (see
// renewalState.ending).
func (r *renewals) ending(a *Attempt) {
	r.mu.Lock()
	a.rs.ending = true
	r.mu.Unlock()
}

// remove stops a's renewals and waits for the one in flight, cancelled,
// to return: no renewal of a runs after remove.
func (r *renewals) remove(a *Attempt) {
	r.mu.Lock()
	a.rs.stopped = true
	if a.rs.idx >= 0 {
		heap.Remove(&r.q, a.rs.idx)
		r.arm()
	}
	if done := r.leaveBatch(a); done != nil {
		// The batch's last attempt: cancelled, and waited for.
		r.mu.Unlock()
		<-done
		return
	}
	inflight, cancel := a.rs.inflight, a.rs.cancel
	if a.rs.queued {
		// Not sent yet: the worker skips it.
		a.rs.queued = false
		a.rs.inflight, a.rs.ctx, a.rs.cancel = nil, nil, nil
		r.mu.Unlock()
		cancel()
		return
	}
	r.mu.Unlock()
	if inflight != nil {
		cancel()
		<-inflight
	}
}

// fire handles every event that is due, then arms the timer for the next.
func (r *renewals) fire() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.at = time.Time{}
	now := time.Now()
	r.timeOut(now)
	// lim: renewals due up to lim go now. With batches, those due within
	// renewWindow ride along (every attempt of a consumer has one lease).
	lim := now
	if r.batch != nil && len(r.q) > 0 {
		lim = now.Add(renewWindow(r.q[0].c.cfg.Lease))
	}
	for len(r.q) > 0 && !r.q[0].rs.due().After(lim) {
		a := r.q[0]
		lease := a.c.cfg.Lease
		if now.Before(a.rs.expiry) && lim.Before(a.rs.tick) {
			// Only its local deadline is within the window: not yet.
			break
		}
		if !now.Before(a.rs.expiry) {
			// The local deadline: expire the attempt unless a renewal
			// landed meanwhile; look again a deadline (or Lease/3) later.
			dl := a.Deadline()
			if !now.Before(dl) {
				// No renewal can land any more (each is bounded by
				// the deadline): stop, rather than report a failed
				// renewal at every tick until the attempt ends.
				a.expire()
				a.rs.stopped = true
				heap.Remove(&r.q, a.rs.idx)
				continue
			}
			a.rs.expiry = dl
		}
		if !lim.Before(a.rs.tick) {
			for !lim.Before(a.rs.tick) {
				a.rs.tick = a.rs.tick.Add(lease / 3)
			}
			if r.batch != nil {
				if a.rs.batch == nil {
					r.ready = append(r.ready, a) // sent below, in batches
				} else {
					a.rs.missed = true // renew again as soon as it returns
				}
			} else if a.rs.inflight == nil {
				a.rs.ctx, a.rs.cancel = context.WithCancel(context.WithoutCancel(a.hctx))
				a.rs.inflight, a.rs.queued = make(chan struct{}), true
				r.ready = append(r.ready, a)
				if r.workers < maxRenewers {
					r.workers++
					go r.work()
				}
			} else {
				a.rs.missed = true // renew again as soon as it returns
				if !a.rs.queued && !a.rs.slow {
					// In flight for Lease/3: stalled. Its goroutine
					// stops counting, so the queue moves on.
					r.uncount(a)
				}
			}
		}
		heap.Fix(&r.q, a.rs.idx)
	}
	if r.batch != nil {
		r.sendBatches()
		r.arm()
		return
	}
	for {
		// Renewals wait behind ones in flight for longer than
		// slowRenewal: those stop counting, so the queue moves on.
		slow, ok := r.nextSlow()
		if !ok || now.Before(slow) {
			break
		}
		r.uncount(r.flying[0])
	}
	// A counted worker not in r.flying is about to take a queued
	// renewal; the others are busy with theirs, so they take none of
	// the queue until their store call returns.
	for r.workers < maxRenewers && r.workers-len(r.flying) < len(r.ready) {
		r.workers++
		go r.work()
	}
	r.arm()
}

// work sends the queued renewals, one at a time, until none is left.
func (r *renewals) work() {
	for {
		r.mu.Lock()
		var a *Attempt
		for a == nil && len(r.ready) > 0 {
			a = r.ready[0]
			r.ready[0] = nil
			r.ready = r.ready[1:]
			if !a.rs.queued {
				a = nil // removed before it was sent
			}
		}
		if a == nil {
			r.ready = nil
			r.workers--
			r.mu.Unlock()
			return
		}
		a.rs.queued = false
		ctx, cancel, done := a.rs.ctx, a.rs.cancel, a.rs.inflight
		a.rs.ctx = nil
		a.rs.sent = time.Now()
		r.flying = append(r.flying, a)
		if len(r.ready) > 0 {
			r.arm() // the queue waits: this renewal may become slow
		}
		r.mu.Unlock()
		if !r.renew(ctx, cancel, a, done) {
			return
		}
	}
}

// renew runs one scheduled renewal of a and reports whether its worker
// goes on: a worker whose renewal was slow (renewalState.slow) no longer
// counts in r.workers, and goes on only if it can count again. A renewal that finds the lease
// gone marks the attempt lost and ends its renewals; a failed one is
// retried at the next tick (the local deadline still applies). Renewals
// go on whatever happens to the caller's context: an attempt whose caller
// left may still be producing effects, so no other attempt may take over.
func (r *renewals) renew(ctx context.Context, cancel context.CancelFunc, a *Attempt, done chan struct{}) (more bool) {
	defer close(done)
	defer cancel()
	start := time.Now()
	err := a.renew(ctx)
	r.mu.Lock()
	ending := a.rs.ending
	r.mu.Unlock()
	a.renewResult(ctx, err, start, ending, true)
	lost := errors.Is(err, ErrLeaseLost)
	r.mu.Lock()
	more = true
	r.unfly(a)
	if a.rs.slow {
		a.rs.slow = false
		if more = r.workers < maxRenewers; more {
			r.workers++
		}
	}
	a.rs.inflight, a.rs.cancel = nil, nil
	if lost || ctx.Err() == nil {
		r.after(a, lost, err == nil)
	}
	r.mu.Unlock()
	return more
}

// renewResult acts on the result err of a's renewal sent at start: a lost
// lease (ErrLeaseLost) marks the attempt lost, unless its ending write
// was sent (ending: that write, which may have landed, decides); a
// renewal that landed moves the local deadline and tells the hooks;
// another error, unless ctx ended (the renewal was cancelled), goes to
// the store-error hooks and, when report is set, to the log: the next
// tick retries it. ctx is the hooks'.
func (a *Attempt) renewResult(ctx context.Context, err error, start time.Time, ending, report bool) {
	switch {
	case errors.Is(err, ErrLeaseLost) && ending:
		// The ending write may have landed: it decides.
	case errors.Is(err, ErrLeaseLost):
		a.markLost(ctx, "renew", start, err)
	case err == nil:
		a.renewed(start)
		if h := a.c.hooks; h != nil && len(h.renewed) > 0 {
			h.onLease(ctx, h.renewed, LeaseEvent{MessageID: a.Message.ID, Attempt: a.Number, Token: a.Token, Latency: time.Since(start)})
		}
	case ctx.Err() == nil:
		_ = a.c.storeErr(ctx, "renew", a.Message.ID, err)
		if report {
			a.c.cfg.Logger.Warn("idem: lease renewal failed; retrying at the next tick",
				"consumer", a.Consumer, "message_id", a.Message.ID, "err", err,
				"lease_left", time.Until(a.Deadline()))
		}
	}
}

// after sets a's scheduling after a renewal that returned (lost: the
// lease is gone, which ends its renewals; ok: it landed); r.mu is held.
func (r *renewals) after(a *Attempt, lost, ok bool) {
	switch {
	case a.rs.stopped:
	case lost:
		a.rs.stopped = true
		if a.rs.idx >= 0 {
			heap.Remove(&r.q, a.rs.idx)
		}
	default:
		r.reschedule(a, ok)
	}
	r.arm()
}

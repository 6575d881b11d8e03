package idem

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idem-go/idem/idemdriver"
)

// maxRenewBatch bounds the renewals of one batch (one store round trip)
// when the store renews in batches (idemdriver.LeaseBatchRenewer): 10,000
// held attempts renewed every Lease/3 cost a few round trips per tick,
// and a slow answer holds back at most this many renewals. At most
// idemdriver.MaxLeaseBatch.
const maxRenewBatch = 500

// renewWindow is how early a renewal may be sent so that it rides in the
// batch of one that is due now, when the store renews in batches: a
// thirtieth of the lease (1s at the default 30s). Renewing early does not
// add renewals (the next tick stays Lease/3 after the last), and it makes
// the batches of attempts acquired over time: at most Lease/renewWindow
// batch sends (30) per lease, however the renewals are spread.
func renewWindow(lease time.Duration) time.Duration { return lease / 30 }

// renewBatch is one batch of renewals in flight, sent by one goroutine
// (workBatch) in one store call, with its own context: cancelled when
// every attempt in it was removed, not before (an attempt removed
// meanwhile only leaves the batch: its renewal may still land, and its
// result is ignored; a late renewal of a completed or released record is
// refused by the store's fencing).
type renewBatch struct {
	as       []*Attempt
	deadline time.Time // the latest local deadline of as
	live     int       // attempts of as neither settled nor removed; guarded by renewals.mu
	ctx      context.Context
	cancel   context.CancelFunc
	done     chan struct{} // closed when the batch and its attempts renewed alone returned
}

// sendBatches sends the renewals queued in r.ready in batches of at most
// maxRenewBatch, of even sizes, one goroutine each; r.mu is held.
func (r *renewals) sendBatches() {
	n := len(r.ready)
	if n == 0 {
		return
	}
	k := (n + maxRenewBatch - 1) / maxRenewBatch
	size := (n + k - 1) / k
	for i := 0; i < n; i += size {
		as := append([]*Attempt(nil), r.ready[i:min(i+size, n)]...)
		b := &renewBatch{as: as, live: len(as), done: make(chan struct{})}
		b.ctx, b.cancel = context.WithCancel(context.Background())
		for _, a := range as {
			a.rs.batch = b
			if dl := a.Deadline(); dl.After(b.deadline) {
				b.deadline = dl
			}
		}
		go r.workBatch(b)
	}
	clear(r.ready)
	r.ready = r.ready[:0]
}

// leaveBatch removes a, being removed, from the batch it is in, if any;
// it returns the batch's done channel when a was the last attempt whose
// renewal the batch had not settled (the batch is then cancelled, with
// the renewals it sends again alone, and the caller waits for it); r.mu
// is held.
func (r *renewals) leaveBatch(a *Attempt) chan struct{} {
	b := a.rs.batch
	if b == nil {
		return nil
	}
	if b.leave(a) > 0 {
		return nil
	}
	b.cancel()
	return b.done
}

// leave takes a out of b (its renewal settled, or a removed) and returns
// how many attempts are left in it; renewals.mu is held.
func (b *renewBatch) leave(a *Attempt) int {
	a.rs.batch = nil
	b.live--
	return b.live
}

// workBatch sends batch b in one store call, bounded by the store timeout
// and by the latest local deadline of its attempts, and settles each
// attempt's renewal as renew does for one. An element the store did not
// judge (idemdriver.ErrRenewNotJudged: its record was locked) is renewed
// again alone, at once, each on a goroutine of its own, so that a record
// another transaction holds delays no renewal but its own.
func (r *renewals) workBatch(b *renewBatch) {
	defer close(b.done)
	defer b.cancel()
	c := b.as[0].c
	ps := make([]idemdriver.RenewParams, len(b.as))
	for i, a := range b.as {
		ps[i] = idemdriver.RenewParams{Consumer: a.Consumer, MessageID: a.Message.ID, Token: a.Token, Lease: c.cfg.Lease}
	}
	cctx, cancel := callCtx(b.ctx, c.storeTimeout())
	dctx, cancelDeadline := context.WithDeadline(cctx, b.deadline)
	start := time.Now()
	errs, err := r.batch.RenewBatch(dctx, ps)
	cancelDeadline()
	err = timedOut(cctx, err)
	cancel()
	if err == nil && len(errs) != len(ps) {
		err = fmt.Errorf("idem: the store's RenewBatch returned %d results for %d leases", len(errs), len(ps))
	}
	if err != nil && b.ctx.Err() == nil {
		c.cfg.Logger.Warn("idem: lease renewal batch failed; retrying at the next tick",
			"consumer", c.cfg.Name, "leases", len(ps), "err", err)
	}
	// The common case first, in one hold of r.mu: every renewal landed.
	var rest []int
	var renewed []*Attempt
	hooked := c.hooks != nil && len(c.hooks.renewed) > 0
	r.mu.Lock()
	for i, a := range b.as {
		if err != nil || errs[i] != nil {
			rest = append(rest, i)
			continue
		}
		if a.rs.batch != b {
			continue // removed meanwhile
		}
		b.leave(a)
		if a.rs.stopped {
			continue
		}
		a.renewed(start)
		r.reschedule(a, true)
		if hooked {
			renewed = append(renewed, a)
		}
	}
	r.arm()
	r.mu.Unlock()
	for _, a := range renewed {
		c.hooks.onLease(withoutCancel(a.hctx), c.hooks.renewed, LeaseEvent{MessageID: a.Message.ID, Attempt: a.Number, Token: a.Token, Latency: time.Since(start)})
	}
	var alone sync.WaitGroup
	for _, i := range rest {
		a, e := b.as[i], err
		if e == nil {
			e = errs[i]
		}
		if errors.Is(e, idemdriver.ErrRenewNotJudged) {
			r.mu.Lock()
			live := a.rs.batch == b && !a.rs.stopped
			r.mu.Unlock()
			if live {
				alone.Add(1)
				go r.workAlone(b, a, &alone)
				continue
			}
		}
		r.settle(b, a, e, start, err == nil)
	}
	alone.Wait()
}

// workAlone renews a, left unjudged by its batch b, with Renew (waiting
// for its record as a single renewal does), and settles it.
func (r *renewals) workAlone(b *renewBatch, a *Attempt, wg *sync.WaitGroup) {
	defer wg.Done()
	start := time.Now()
	err := a.renew(b.ctx)
	r.settle(b, a, err, start, true)
}

// settle applies the result err of a's renewal sent at start in batch b,
// as renew does for one: lost (ErrLeaseLost) ends the renewals and marks
// the attempt lost unless its ending write was sent; another error is
// retried at the next tick (reported unless the batch failed as a whole,
// which workBatch logged once). An attempt removed meanwhile is left as it
// is.
func (r *renewals) settle(b *renewBatch, a *Attempt, err error, start time.Time, report bool) {
	r.mu.Lock()
	mine, stopped, ending := a.rs.batch == b, a.rs.stopped, a.rs.ending
	r.mu.Unlock()
	if !mine || stopped {
		r.mu.Lock()
		if a.rs.batch == b {
			b.leave(a)
		}
		r.mu.Unlock()
		return
	}
	a.renewResult(withoutCancel(a.hctx), err, start, ending, report)
	r.mu.Lock()
	defer r.mu.Unlock()
	if a.rs.batch != b {
		return // removed meanwhile
	}
	b.leave(a)
	r.after(a, errors.Is(err, ErrLeaseLost), err == nil)
}

// reschedule sets a's next events after a renewal that returned (ok when
// it landed): the local deadline moves to the new one, and a renewal that
// came due meanwhile (one slower than Lease/3: a stalled store or
// machine) goes at once, as a ticker's pending tick would; r.mu is held,
// and the caller arms.
func (r *renewals) reschedule(a *Attempt, ok bool) {
	if ok {
		a.rs.expiry = a.Deadline()
	}
	if a.rs.missed {
		a.rs.missed = false
		a.rs.tick = time.Now()
	}
	if a.rs.idx >= 0 {
		heap.Fix(&r.q, a.rs.idx)
	}
}

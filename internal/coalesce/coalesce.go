// Package coalesce gathers the calls that goroutines make at the same
// time into batch calls, as a group commit does: a call that finds no
// batch in flight goes out at once, alone and on its caller's own
// context (no added wait when idle); the calls that arrive while one is
// in flight queue, and when it returns the first of them sends them
// together, up to a bound, in one batch call. The lease engine uses it
// for the Acquire and Complete calls of a LeaseConsumer over an
// idemdriver.LeaseBatcher. Standard library only.
package coalesce

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Group coalesces the calls of one method. Its fields are set before the
// first Do and not changed after; the zero Group is not usable. Safe for
// concurrent use; it starts no goroutine: a caller sends the batch its
// call is in (the first queued caller sends the next batch when the one
// in flight returns).
//
// A queued call whose context ends before it is taken into a batch
// leaves the queue and returns the context's error: it is not sent. One
// taken into a batch of more than one waits for the batch's answer (it
// may have been applied already), bounded by the batch's deadline: the
// earliest deadline of the contexts of its calls, so that no call waits
// longer than its own bound. The batch call's context carries the values
// of its first call's context, without its cancellation.
type Group[P, R any] struct {
	// Max is the most calls in one batch call (at least 1).
	Max int
	// One sends a call alone.
	One func(ctx context.Context, p P) (R, error)
	// Many sends calls together: one result and one error per call, in
	// order, or err, the error of every call.
	Many func(ctx context.Context, ps []P) (res []R, errs []error, err error)

	mu    sync.Mutex
	queue []*call[P, R]
	busy  bool // a call or a batch is in flight
	// batch and ps are reused by the one batch in flight at a time.
	batch []*call[P, R]
	ps    []P
	pool  sync.Pool

	calls, trips atomic.Uint64
}

// call is one queued call; taken from the group's pool and given back
// when its caller returns.
type call[P, R any] struct {
	ctx context.Context
	p   P
	res R
	err error
	// queued says that the call is in the queue; next that it was handed
	// the next batch (wake holds false). Both guarded by the group's mu.
	queued, next bool
	// wake gets one value per hand-over (false: the caller is to send
	// the next batch) or answer (true: res and err are set).
	wake chan bool
}

// Stats is what a Group has sent: its calls and the store calls (round
// trips) they went in.
type Stats struct {
	Calls, Trips uint64
}

// Stats returns the calls and trips so far.
func (g *Group[P, R]) Stats() Stats {
	return Stats{Calls: g.calls.Load(), Trips: g.trips.Load()}
}

// Do makes the call p: alone on ctx when no batch is in flight, else in
// the next batch. It returns the call's own result and error; ctx's
// error, without sending it, when ctx ended before it was sent.
func (g *Group[P, R]) Do(ctx context.Context, p P) (R, error) {
	var zero R
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	g.mu.Lock()
	if !g.busy {
		g.busy = true
		g.mu.Unlock()
		defer g.handOver()
		g.calls.Add(1)
		g.trips.Add(1)
		return g.One(ctx, p)
	}
	c, _ := g.pool.Get().(*call[P, R])
	if c == nil {
		c = &call[P, R]{wake: make(chan bool, 1)}
	}
	c.ctx, c.p, c.queued = ctx, p, true
	g.queue = append(g.queue, c)
	g.mu.Unlock()
	var send bool
	select {
	case v := <-c.wake:
		send = !v
	case <-ctx.Done():
		if g.leave(c) {
			g.put(c)
			return zero, ctx.Err()
		}
		send = !<-c.wake
	}
	if send {
		g.send(c)
		<-c.wake // its own answer
	}
	return g.put(c)
}

// put returns c's answer and gives c back to the pool, without its
// references to the caller's context, parameters and result.
func (g *Group[P, R]) put(c *call[P, R]) (R, error) {
	res, err := c.res, c.err
	var zp P
	var zr R
	c.ctx, c.p, c.res, c.err = nil, zp, zr, nil
	g.pool.Put(c)
	return res, err
}

// leave takes c out of the queue and reports whether it was there (not
// yet taken into a batch); a call handed the next batch hands it on.
func (g *Group[P, R]) leave(c *call[P, R]) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !c.queued {
		return false
	}
	c.queued = false
	for i, q := range g.queue {
		if q == c {
			g.queue = slices.Delete(g.queue, i, i+1) // zeroes the freed slot
			break
		}
	}
	if c.next {
		<-c.wake // the hand-over's false, sent under mu
		c.next = false
		g.handOverLocked()
	}
	return true
}

// handOver ends the call or batch in flight: the first queued call is
// handed the next batch, or the group is idle.
func (g *Group[P, R]) handOver() {
	g.mu.Lock()
	g.handOverLocked()
	g.mu.Unlock()
}

// handOverLocked is handOver with g.mu held.
func (g *Group[P, R]) handOverLocked() {
	if len(g.queue) == 0 {
		g.busy = false
		return
	}
	n := g.queue[0]
	n.next = true
	n.wake <- false // never blocks: its only value
}

// send sends the batch that c (handed it, the first in the queue) leads:
// the queued calls up to Max, but those whose context ended, which are
// answered with its error unsent. c's answer is in c when it returns.
func (g *Group[P, R]) send(c *call[P, R]) {
	g.mu.Lock()
	c.next = false
	n := min(len(g.queue), max(g.Max, 1))
	batch := g.batch[:0]
	var ended []*call[P, R]
	for _, q := range g.queue[:n] {
		q.queued = false
		if err := q.ctx.Err(); err != nil {
			q.err = err
			ended = append(ended, q)
			continue
		}
		batch = append(batch, q)
	}
	clear(g.queue[:n])
	g.queue = g.queue[n:]
	g.mu.Unlock()
	defer g.handOver()
	for _, q := range ended {
		q.wake <- true
	}
	g.run(batch)
	g.batch = clear0(batch)
}

// run sends batch (none, one call alone on its own context, or more in
// one batch call) and answers its calls. A panic of the call answers them
// with an error before it goes on.
func (g *Group[P, R]) run(batch []*call[P, R]) {
	if len(batch) == 0 {
		return
	}
	done := false
	defer func() {
		if !done {
			r := recover()
			for _, q := range batch {
				q.err = fmt.Errorf("coalesce: the batch call panicked: %v", r)
				q.wake <- true
			}
			panic(r)
		}
		for _, q := range batch {
			q.wake <- true
		}
	}()
	g.calls.Add(uint64(len(batch)))
	g.trips.Add(1)
	if len(batch) == 1 {
		q := batch[0]
		q.res, q.err = g.One(q.ctx, q.p)
		done = true
		return
	}
	// The parameters in order, and the earliest deadline.
	ps, dl := g.ps[:0], time.Time{}
	for _, q := range batch {
		ps = append(ps, q.p)
		if d, ok := q.ctx.Deadline(); ok && (dl.IsZero() || d.Before(dl)) {
			dl = d
		}
	}
	ctx := context.WithoutCancel(batch[0].ctx)
	if !dl.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl)
		defer cancel()
	}
	res, errs, err := g.Many(ctx, ps)
	g.ps = clear0(ps)
	if err == nil && (len(res) != len(batch) || len(errs) != len(batch)) {
		err = fmt.Errorf("coalesce: %d results and %d errors for %d calls", len(res), len(errs), len(batch))
	}
	for i, q := range batch {
		if err != nil {
			q.err = err
			continue
		}
		q.res, q.err = res[i], errs[i]
	}
	done = true
}

// clear0 clears s and returns it emptied, for reuse without references
// to what it held.
func clear0[T any](s []T) []T {
	clear(s)
	return s[:0]
}

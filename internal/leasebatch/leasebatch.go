// Package leasebatch turns the Acquire and Complete calls that many
// goroutines make at the same time on a lease store into batches
// (idemdriver.LeaseBatcher), a group commit: while one batch is in the
// store, the calls that arrive wait, and go together in the next one. A
// process that runs many messages at once (the idem consume sidecar, with
// its --concurrency) then commits the store once per batch instead of once
// per message. It is internal: not part of idem's API. Standard library
// and the root module only.
package leasebatch

import (
	"context"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/idem-go/idem/idemdriver"
)

// Store is a LeaseStore over a LeaseBatcher whose Acquire and Complete
// are batched; Renew, Release, SaveStep and retention go to the store as
// they are. It is a StepRecorder when the store is one. Safe for
// concurrent use; it starts no goroutine (the first caller of a batch
// runs it, then hands over to the first caller that waited).
type Store struct {
	idemdriver.LeaseBatcher
	acquire  group[*idemdriver.AcquireParams, idemdriver.AcquireResult]
	complete group[*idemdriver.CompleteParams, struct{}]
}

var _ idemdriver.StepRecorder = (*Store)(nil)

// New returns a Store over b whose batches hold at most size calls (at
// least 1, at most idemdriver.MaxLeaseBatch). A batch is bounded by the
// deadline of the context of the call that runs it, not by that
// context's cancellation (a caller that leaves does not cancel the
// others' calls): the lease engine gives each store call a context whose
// deadline is Config.StoreTimeout from the call's start, so a batch ends
// by the store timeout of the call that runs it: the first to arrive of
// the batch, whose deadline is the earliest when the calls have one store
// timeout. A call without a deadline (a consumer whose StoreTimeout is
// negative, under a caller's context without one) runs an unbounded
// batch. A call that joins a batch run on an earlier deadline than its
// own fails at that deadline (an error matching context.DeadlineExceeded,
// which the lease engine reports with ErrStore): nothing is acknowledged
// and the redelivery tries again. Running a batch on the latest deadline
// of its calls instead would let its first calls outlast their own store
// timeout, which the lease's renewal period is reckoned from.
func New(b idemdriver.LeaseBatcher, size int) *Store {
	size = min(max(size, 1), idemdriver.MaxLeaseBatch)
	s := &Store{LeaseBatcher: b}
	s.acquire = group[*idemdriver.AcquireParams, idemdriver.AcquireResult]{max: size,
		one: b.Acquire, many: b.AcquireBatch}
	s.complete = group[*idemdriver.CompleteParams, struct{}]{max: size,
		one: func(ctx context.Context, p *idemdriver.CompleteParams) (struct{}, error) {
			return struct{}{}, b.Complete(ctx, p)
		},
		many: func(ctx context.Context, ps []*idemdriver.CompleteParams) ([]struct{}, []error, error) {
			errs, err := b.CompleteBatch(ctx, ps)
			return make([]struct{}, len(ps)), errs, err
		}}
	return s
}

// CoalescesCalls reports that the Store batches the concurrent Acquire
// and Complete calls itself: a LeaseConsumer over it sends each call
// alone (idem.Config.Coalesce does not apply), so that its calls reach
// this layer as they are made.
func (s *Store) CoalescesCalls() bool { return true }

// RecordsSteps implements idemdriver.StepRecorder: the store's answer.
func (s *Store) RecordsSteps() bool { return idemdriver.RecordsSteps(s.LeaseBatcher) }

// Acquire implements idemdriver.LeaseStore: the call joins the next batch
// (idemdriver.LeaseBatcher.AcquireBatch), or runs alone when no other
// waits.
func (s *Store) Acquire(ctx context.Context, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	return s.acquire.do(ctx, p)
}

// Complete implements idemdriver.LeaseStore: the call joins the next
// batch (idemdriver.LeaseBatcher.CompleteBatch), or runs alone.
func (s *Store) Complete(ctx context.Context, p *idemdriver.CompleteParams) error {
	_, err := s.complete.do(ctx, p)
	return err
}

// AcquireBatch implements idemdriver.LeaseBatcher: a batch made by the
// caller (idem.LeaseConsumer.AcquireBatch) goes to the store as it is, in
// one call, counted in Stats as one batch of Acquire.
func (s *Store) AcquireBatch(ctx context.Context, ps []*idemdriver.AcquireParams) ([]idemdriver.AcquireResult, []error, error) {
	s.acquire.count(len(ps))
	return s.LeaseBatcher.AcquireBatch(ctx, ps)
}

// CompleteBatch implements idemdriver.LeaseBatcher: as AcquireBatch, for
// Complete.
func (s *Store) CompleteBatch(ctx context.Context, ps []*idemdriver.CompleteParams) ([]error, error) {
	s.complete.count(len(ps))
	return s.LeaseBatcher.CompleteBatch(ctx, ps)
}

// SizeClasses is the number of batch size classes of GroupStats: class i
// holds the batches of 2^i to 2^(i+1)-1 calls (class 0: a call alone),
// the last one every batch of 2^(SizeClasses-1) calls or more.
const SizeClasses = 7

// GroupStats is what one method (Acquire or Complete) has sent so far:
// its calls, the store calls (round trips) they went in, and, by size
// class (SizeClasses), the batches of that size and the calls in them.
type GroupStats struct {
	Calls, Trips uint64
	Batches      [SizeClasses]uint64
	CallsIn      [SizeClasses]uint64
}

// Stats is what a Store has sent so far, by method.
type Stats struct {
	Acquire, Complete GroupStats
}

// Stats reports the calls and batches sent so far, by method and by
// batch size. Safe to call while the store is in use; the figures are
// read one at a time, not as one snapshot.
func (s *Store) Stats() Stats {
	return Stats{Acquire: s.acquire.stats(), Complete: s.complete.stats()}
}

// sizeClass is the GroupStats size class of a batch of n calls (n ≥ 1).
func sizeClass(n int) int {
	return min(bits.Len(uint(n))-1, SizeClasses-1)
}

// call is one caller's call in a group, taken from the group's pool and
// given back to it when the caller returns (its wake channel with it).
type call[P, R any] struct {
	p   P
	res R
	err error
	// wake gets one value per send or hand-over: true when res and err
	// are set, false when the caller is to run the next batch; the
	// caller that runs a batch gets its own true too, which it takes
	// before giving the call back (one channel, not two: a call is
	// either sent in a batch or handed the next one, never both before
	// it returns).
	wake chan bool
}

// group batches the calls of one method. The caller that finds no batch
// running runs one with what waits (up to max calls, its own among them),
// then, if more wait, makes the first of them run the next.
type group[P, R any] struct {
	max  int
	one  func(ctx context.Context, p P) (R, error)
	many func(ctx context.Context, ps []P) ([]R, []error, error)

	mu    sync.Mutex
	queue []*call[P, R]
	busy  bool
	// batch and ps are the slices of the batch running, kept for the
	// next one: one batch runs at a time (busy), and the next runner
	// starts once send is done with them.
	batch []*call[P, R]
	ps    []P
	// pool holds the calls whose callers returned.
	pool sync.Pool

	// calls and batches count what send sent: calls, and the batches
	// (store round trips) they went in; bySize and callsBySize count
	// the batches and their calls by size class (sizeClass).
	calls, batches      atomic.Uint64
	bySize, callsBySize [SizeClasses]atomic.Uint64
}

// count records one store call of n calls (n ≥ 1) in the stats.
func (g *group[P, R]) count(n int) {
	if n < 1 {
		return
	}
	g.calls.Add(uint64(n))
	g.batches.Add(1)
	g.bySize[sizeClass(n)].Add(1)
	g.callsBySize[sizeClass(n)].Add(uint64(n))
}

func (g *group[P, R]) stats() GroupStats {
	s := GroupStats{Calls: g.calls.Load(), Trips: g.batches.Load()}
	for i := range SizeClasses {
		s.Batches[i], s.CallsIn[i] = g.bySize[i].Load(), g.callsBySize[i].Load()
	}
	return s
}

func (g *group[P, R]) do(ctx context.Context, p P) (R, error) {
	if err := ctx.Err(); err != nil {
		var zero R
		return zero, err // as the store would: nothing is sent
	}
	c, _ := g.pool.Get().(*call[P, R])
	if c == nil {
		c = &call[P, R]{wake: make(chan bool, 1)}
	}
	c.p = p
	g.mu.Lock()
	g.queue = append(g.queue, c)
	if !g.busy {
		g.busy = true
		g.mu.Unlock()
		g.run(ctx, c)
		<-c.wake // its own true, from send
		return g.release(c)
	}
	g.mu.Unlock()
	// A waiting call is bounded by the batches ahead of it, each by the
	// context of the caller that runs it: it does not leave early, since
	// its call may already be in the store.
	if !<-c.wake {
		g.run(ctx, c)
		<-c.wake
	}
	return g.release(c)
}

// release returns c's result and gives c back to the pool, without its
// references to the caller's parameters and result.
func (g *group[P, R]) release(c *call[P, R]) (R, error) {
	res, err := c.res, c.err
	var zp P
	var zr R
	c.p, c.res, c.err = zp, zr, nil
	g.pool.Put(c)
	return res, err
}

// run sends the waiting calls (c first among them) as one batch on ctx,
// without its cancellation but with its deadline, then hands over; c's
// result is in c when it returns.
func (g *group[P, R]) run(ctx context.Context, c *call[P, R]) {
	g.mu.Lock()
	n := min(len(g.queue), g.max)
	batch := append(g.batch[:0], g.queue[:n]...)
	clear(g.queue[:n]) // no reference to a call given back to the pool
	g.queue = g.queue[n:]
	g.mu.Unlock()

	bctx := context.WithoutCancel(ctx)
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		bctx, cancel = context.WithDeadline(bctx, dl)
		defer cancel()
	}
	g.send(bctx, batch)
	clear(batch)
	g.batch = batch[:0] // before the hand-over: the next runner takes it

	g.mu.Lock()
	if len(g.queue) == 0 {
		g.busy = false
	} else {
		g.queue[0].wake <- false // never blocks: its only value
	}
	g.mu.Unlock()
}

// send runs batch and settles its calls: one call alone as the single
// method, more as one batch.
func (g *group[P, R]) send(ctx context.Context, batch []*call[P, R]) {
	g.count(len(batch))
	defer func() {
		for _, c := range batch {
			c.wake <- true // never blocks: its only value
		}
	}()
	if len(batch) == 1 {
		batch[0].res, batch[0].err = g.one(ctx, batch[0].p)
		return
	}
	ps := g.ps[:0]
	for _, c := range batch {
		ps = append(ps, c.p)
	}
	res, errs, err := g.many(ctx, ps)
	clear(ps)
	g.ps = ps[:0]
	for i, c := range batch {
		switch {
		case err != nil:
			c.err = err
		case i < len(res) && i < len(errs):
			c.res, c.err = res[i], errs[i]
		default:
			c.err = fmt.Errorf("leasebatch: the store answered %d results and %d errors for %d calls", len(res), len(errs), len(batch))
		}
	}
}

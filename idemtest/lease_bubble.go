package idemtest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
)

// batchGuard bounds, in real time, a store call that bubbleStore sends
// from outside its bubble: a call that waited for a locked record
// (which it must not) fails then instead of hanging the case.
const batchGuard = 30 * time.Second

// bubbleStore is the Setup's store for a LeaseConsumer in a
// testing/synctest bubble, whose clock runs the renewal ticks and the
// local deadlines: a machine too loaded to run the consumer on time
// cannot end a lease by itself. Acquire, Renew, RenewBatch, Complete,
// Release and SaveStep go to the Setup's store from outside the bubble
// (out), one at a time, each bounded by batchGuard, under ctx; a call
// held outside stops the bubble's clock. MarkRunning does nothing.
//
// A Renew of the held record (hold) waits in the bubble until release,
// as the store would wait for its lock.
//
// After followClock, the store's clock follows the bubble's: before each
// call, every time the store recorded for the consumer moves back by the
// bubble's time since the previous call (LeaseSetup.Shift), so a lease
// that is not renewed runs out in the store as the bubble's time passes.
// The machine's own time passes too, but only the time between two calls
// can cost a lease, not a renewal tick the machine ran late.
type bubbleStore struct {
	idemdriver.LeaseStore
	t   *testing.T // the case's, outside the bubble
	s   *LeaseSetup
	out *outside
	ctx context.Context

	mu       sync.Mutex
	held     string
	released chan struct{} // made in the bubble, by hold

	// followed is the consumer whose times follow the bubble's clock,
	// and last the bubble's time when they last did; set by followClock,
	// then read and written outside the bubble only.
	followed string
	last     time.Time

	batchFailures atomic.Int64
}

// newBubbleStore wraps b's store; called outside the bubble.
func newBubbleStore(t *testing.T, b *leaseBundle) *bubbleStore {
	return &bubbleStore{LeaseStore: b.s.Store, t: t, s: b.s, out: newOutside(t), ctx: b.ctx}
}

// followClock makes the store's times of consumer follow the bubble's
// clock from now on; called in the bubble, before the first call.
func (s *bubbleStore) followClock(consumer string) {
	s.followed, s.last = consumer, time.Now()
}

// hold makes the Renew calls of record id wait until release; called in
// the bubble.
func (s *bubbleStore) hold(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held, s.released = id, make(chan struct{})
}

// release lets the held record's Renew calls go on.
func (s *bubbleStore) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held = ""
	close(s.released)
}

// call runs f outside the bubble on a context bounded by batchGuard,
// after moving the followed consumer's times back by the bubble's time
// since the previous call.
func (s *bubbleStore) call(f func(ctx context.Context)) {
	now := time.Now() // the bubble's clock
	s.out.do(func() {
		ctx, cancel := context.WithTimeout(s.ctx, batchGuard)
		defer cancel()
		if d := now.Sub(s.last); s.followed != "" && d > 0 {
			if err := s.s.Shift(ctx, s.followed, d); err != nil {
				s.t.Errorf("moving the store's times of %q back by %v (LeaseSetup.Shift): %v", s.followed, d, err)
			}
			s.last = now
		}
		f(ctx)
	})
}

func (s *bubbleStore) Acquire(_ context.Context, p *idemdriver.AcquireParams) (res idemdriver.AcquireResult, err error) {
	s.call(func(ctx context.Context) { res, err = s.LeaseStore.Acquire(ctx, p) })
	return res, err
}

func (s *bubbleStore) Complete(_ context.Context, p *idemdriver.CompleteParams) (err error) {
	s.call(func(ctx context.Context) { err = s.LeaseStore.Complete(ctx, p) })
	return err
}

// MarkRunning does nothing: retention is not under test here.
func (s *bubbleStore) MarkRunning(context.Context, *idemdriver.MarkRunningParams) error { return nil }

func (s *bubbleStore) Release(_ context.Context, p *idemdriver.ReleaseParams) (err error) {
	s.call(func(ctx context.Context) { err = s.LeaseStore.Release(ctx, p) })
	return err
}

func (s *bubbleStore) SaveStep(_ context.Context, p *idemdriver.StepParams) (err error) {
	s.call(func(ctx context.Context) { err = s.LeaseStore.SaveStep(ctx, p) })
	return err
}

func (s *bubbleStore) Renew(_ context.Context, p *idemdriver.RenewParams) (err error) {
	s.mu.Lock()
	held, released := s.held, s.released
	s.mu.Unlock()
	if held == p.MessageID {
		<-released
	}
	s.call(func(ctx context.Context) { err = s.LeaseStore.Renew(ctx, p) })
	return err
}

// RenewsBatches is the Setup's store's.
func (s *bubbleStore) RenewsBatches() bool {
	r, ok := s.LeaseStore.(idemdriver.LeaseBatchRenewer)
	return ok && r.RenewsBatches()
}

func (s *bubbleStore) RenewBatch(_ context.Context, ps []idemdriver.RenewParams) (errs []error, err error) {
	s.call(func(ctx context.Context) {
		errs, err = s.LeaseStore.(idemdriver.LeaseBatchRenewer).RenewBatch(ctx, ps)
	})
	if err != nil {
		s.batchFailures.Add(1)
	}
	return errs, err
}

// inBubble is b for the bubble of t (the t synctest.Test gives): its
// checks fail t, its calls carry a context of the bubble, and its Setup
// is w's, whose ExpireLease and CountRecords go through w too. Consumers
// made from it are closed when the bubble ends.
func (b *leaseBundle) inBubble(t *testing.T, w *bubbleStore) *leaseBundle {
	s := *b.s
	s.Store = w
	s.ExpireLease = func(_ context.Context, consumer, id string) (err error) {
		w.call(func(ctx context.Context) { err = b.s.ExpireLease(ctx, consumer, id) })
		return err
	}
	s.CountRecords = func(_ context.Context, consumer string) (n int, err error) {
		w.call(func(ctx context.Context) { n, err = b.s.CountRecords(ctx, consumer) })
		return n, err
	}
	return &leaseBundle{t: t, s: &s, ctx: context.Background(), prefix: b.prefix}
}

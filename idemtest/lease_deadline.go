package idemtest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/leasebatch"
)

// The StoreTimeout cases check that every store call the lease engine
// makes, batched or not, is bounded by Config.StoreTimeout: a store that
// stalls, honouring its context, makes the call end at the timeout from
// its start, on a context whose deadline says so, with an error matching
// ErrStore and ErrStoreTimeout, and nothing is acknowledged as done: the
// record is not completed, and the redelivery after the stall processes
// the message. They run the LeaseConsumer in a testing/synctest bubble, so
// the timeout passes on the bubble's clock, exactly and without waiting;
// the calls that do not stall go to the Setup's store from a goroutine
// outside the bubble, under the case's context, so the store (its
// connection pool) is never touched from inside it. Batched: the Acquire
// and Complete calls go through internal/leasebatch, as `idem consume`
// sends them, three messages at once.
func leaseDeadlineCases() []leaseCase {
	return []leaseCase{
		{"AcquireStalls", leaseStallCase(stallAcquire, false)},
		{"CompleteStalls", leaseStallCase(stallComplete, false)},
		{"ReleaseStalls", leaseStallCase(stallRelease, false)},
		{"SaveStepStalls", leaseStallCase(stallSaveStep, false)},
		{"RenewStalls", leaseStallCase(stallRenew, false)},
		{"RenewBatchStalls", leaseStallCase(stallRenewBatch, false)},
		{"BatchedAcquireStalls", leaseStallCase(stallAcquire, true)},
		{"BatchedCompleteStalls", leaseStallCase(stallComplete, true)},
	}
}

// leaseStallTimeout is the StoreTimeout of the StoreTimeout cases: on
// the bubble's clock, so its length costs no time.
const leaseStallTimeout = 2 * time.Second

// stallKind names the lease store call that stalls.
type stallKind int

const (
	stallAcquire    stallKind = iota // Acquire and AcquireBatch
	stallComplete                    // Complete and CompleteBatch
	stallRelease                     // Release
	stallSaveStep                    // SaveStep
	stallRenew                       // Renew
	stallRenewBatch                  // RenewBatch
)

func (k stallKind) String() string {
	return [...]string{"Acquire", "Complete", "Release", "SaveStep", "Renew", "RenewBatch"}[k]
}

// outside runs functions on a goroutine outside a synctest bubble, one
// at a time: the calls that go to a store made outside the bubble.
type outside struct {
	mu   sync.Mutex
	fns  chan func()
	done chan struct{}
}

// newOutside starts the goroutine; it ends with t.
func newOutside(t *testing.T) *outside {
	o := &outside{fns: make(chan func()), done: make(chan struct{})}
	go func() {
		for f := range o.fns {
			f()
			o.done <- struct{}{}
		}
	}()
	t.Cleanup(func() { close(o.fns) })
	return o
}

// do runs f outside the bubble and returns when it has.
func (o *outside) do(f func()) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.fns <- f
	<-o.done
}

// stalledCall is one store call that stalled: when it started and
// ended, its context's deadline, and how many calls it carried.
type stalledCall struct {
	start, end, deadline time.Time
	hasDeadline          bool
	n                    int
}

// stallStore is a lease store for a LeaseConsumer in a synctest bubble:
// the calls of kind stalls wait for their context to end and return its
// error (a connection that stopped answering, under a driver that
// honours its context); the others go to inner from outside the bubble,
// under ctx. It is a LeaseBatcher (over a store that is not one, each
// element alone) and a LeaseBatchRenewer when batches is set. Retention
// calls do nothing.
type stallStore struct {
	inner   idemdriver.LeaseStore
	out     *outside
	ctx     context.Context
	kind    stallKind
	batches bool
	armed   atomic.Bool

	mu      sync.Mutex
	stalled []stalledCall
}

// stallGiveUp is how long a stalled call waits for its context at most:
// far past the store timeout, so that a call left unbounded fails the
// case instead of hanging it.
const stallGiveUp = 10 * leaseStallTimeout

// errUnbounded is the error of a stalled call whose context did not end.
var errUnbounded = errors.New("idemtest: a stalled store call's context did not end")

// stall waits for ctx to end, as a stalled connection's call does (at
// most stallGiveUp), and records the call.
func (s *stallStore) stall(ctx context.Context, n int) error {
	c := stalledCall{start: time.Now(), n: n}
	c.deadline, c.hasDeadline = ctx.Deadline()
	t := time.NewTimer(stallGiveUp)
	defer t.Stop()
	err := errUnbounded
	select {
	case <-ctx.Done():
		err = ctx.Err()
	case <-t.C:
	}
	c.end = time.Now()
	s.mu.Lock()
	s.stalled = append(s.stalled, c)
	s.mu.Unlock()
	return err
}

func (s *stallStore) stalls(k stallKind) bool { return s.kind == k && s.armed.Load() }

func (s *stallStore) Acquire(ctx context.Context, p *idemdriver.AcquireParams) (res idemdriver.AcquireResult, err error) {
	if s.stalls(stallAcquire) {
		return res, s.stall(ctx, 1)
	}
	s.out.do(func() { res, err = s.inner.Acquire(s.ctx, p) })
	return res, err
}

func (s *stallStore) Renew(ctx context.Context, p *idemdriver.RenewParams) (err error) {
	if s.stalls(stallRenew) {
		return s.stall(ctx, 1)
	}
	s.out.do(func() { err = s.inner.Renew(s.ctx, p) })
	return err
}

func (s *stallStore) Complete(ctx context.Context, p *idemdriver.CompleteParams) (err error) {
	if s.stalls(stallComplete) {
		return s.stall(ctx, 1)
	}
	s.out.do(func() { err = s.inner.Complete(s.ctx, p) })
	return err
}

func (s *stallStore) Release(ctx context.Context, p *idemdriver.ReleaseParams) (err error) {
	if s.stalls(stallRelease) {
		return s.stall(ctx, 1)
	}
	s.out.do(func() { err = s.inner.Release(s.ctx, p) })
	return err
}

func (s *stallStore) SaveStep(ctx context.Context, p *idemdriver.StepParams) (err error) {
	if s.stalls(stallSaveStep) {
		return s.stall(ctx, 1)
	}
	s.out.do(func() { err = s.inner.SaveStep(s.ctx, p) })
	return err
}

func (s *stallStore) AcquireBatch(ctx context.Context, ps []*idemdriver.AcquireParams) (res []idemdriver.AcquireResult, errs []error, err error) {
	if s.stalls(stallAcquire) {
		return nil, nil, s.stall(ctx, len(ps))
	}
	res, errs = make([]idemdriver.AcquireResult, len(ps)), make([]error, len(ps))
	s.out.do(func() {
		if b, ok := s.inner.(idemdriver.LeaseBatcher); ok {
			res, errs, err = b.AcquireBatch(s.ctx, ps)
			return
		}
		for i, p := range ps {
			res[i], errs[i] = s.inner.Acquire(s.ctx, p)
		}
	})
	return res, errs, err
}

func (s *stallStore) CompleteBatch(ctx context.Context, ps []*idemdriver.CompleteParams) (errs []error, err error) {
	if s.stalls(stallComplete) {
		return nil, s.stall(ctx, len(ps))
	}
	errs = make([]error, len(ps))
	s.out.do(func() {
		if b, ok := s.inner.(idemdriver.LeaseBatcher); ok {
			errs, err = b.CompleteBatch(s.ctx, ps)
			return
		}
		for i, p := range ps {
			errs[i] = s.inner.Complete(s.ctx, p)
		}
	})
	return errs, err
}

// RenewsBatches implements idemdriver.LeaseBatchRenewer.
func (s *stallStore) RenewsBatches() bool { return s.batches }

func (s *stallStore) RenewBatch(ctx context.Context, ps []idemdriver.RenewParams) (errs []error, err error) {
	if s.stalls(stallRenewBatch) {
		return nil, s.stall(ctx, len(ps))
	}
	errs = make([]error, len(ps))
	s.out.do(func() {
		for i := range ps {
			errs[i] = s.inner.Renew(s.ctx, &ps[i])
		}
	})
	return errs, nil
}

func (s *stallStore) MarkRunning(context.Context, *idemdriver.MarkRunningParams) error { return nil }

func (s *stallStore) BeginPurge(context.Context, *idemdriver.BeginPurgeParams) (idemdriver.PurgeSession, error) {
	return nil, errors.New("idemtest: no purge in the StoreTimeout cases")
}

// leaseStallCase returns the case in which the store calls of kind k
// stall (batched: through leasebatch, three messages at once). Each
// delivery (or, for a renewal, the attempt's call) ends exactly
// leaseStallTimeout after the stalled call started, on the bubble's
// clock; every stalled store call had a deadline no later than the store
// timeout from its start and ended at it; a delivery fails with ErrStore
// and ErrStoreTimeout, never acknowledged; its record is not completed,
// and the redelivery once the lease has ended is processed.
func leaseStallCase(k stallKind, batched bool) func(t *testing.T, b *leaseBundle) {
	return func(t *testing.T, b *leaseBundle) {
		w := &stallStore{inner: b.s.Store, out: newOutside(t), ctx: b.ctx, kind: k, batches: k == stallRenewBatch}
		var store idemdriver.LeaseStore = w
		n, coalesce := 1, 0
		if batched {
			// leasebatch batches the calls: the consumer sends each
			// alone (Config.Coalesce 1).
			store, n, coalesce = leasebatch.New(w, 8), 3, 1
		}
		ms := msgs("m-", n)
		name := b.name("c")
		var calls atomic.Int64
		synctest.Test(t, func(t *testing.T) {
			c, err := idem.NewLeaseConsumer(store, idem.Config{Name: name, Lease: 30 * time.Second, StoreTimeout: leaseStallTimeout, Coalesce: coalesce,
				PurgeInterval: -1, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = c.Close() }()
			w.armed.Store(true)
			if k == stallRenew || k == stallRenewBatch {
				stallRenewal(t, c, w, ms[0], &calls)
				return
			}
			var wg sync.WaitGroup
			for _, m := range ms {
				wg.Go(func() {
					start := time.Now()
					out, err := c.Process(context.Background(), m, stallHandler(k, &calls))
					took := time.Since(start)
					checkOutcome(t, "delivery whose "+k.String()+" stalls", m.ID, out, err, idem.Failed, idem.ErrStore)
					if !errors.Is(err, idem.ErrStoreTimeout) {
						t.Errorf("%s: delivery whose %v stalls: %v, want an error matching ErrStoreTimeout", m.ID, k, err)
					}
					if took != leaseStallTimeout {
						t.Errorf("%s: delivery whose %v stalls took %v, want the store timeout (%v)", m.ID, k, took, leaseStallTimeout)
					}
				})
			}
			wg.Wait()
		})
		w.armed.Store(false)
		w.checkStalled(t, k, batched)
		if k == stallRenew || k == stallRenewBatch {
			return
		}
		want := int64(n)
		if k == stallAcquire {
			want = 0
			b.wantRecords("after the stalled Acquire calls", name, 0)
		}
		if calls.Load() != want {
			t.Errorf("handler ran %d times, want %d", calls.Load(), want)
		}
		// Not completed: an Acquire finds the record in progress (its lease
		// live, or released), never completed; the redelivery after the
		// lease ended is processed.
		c := b.consumer("c", idem.Config{MaxAttempts: 5})
		ok := result(&calls, idem.Result{Body: []byte("ok")})
		wantAttempt := 2
		if k == stallAcquire {
			wantAttempt = 1
		}
		for _, m := range ms {
			if k == stallComplete || k == stallRelease {
				// Abandoned, its lease live: in progress until it ends.
				res := b.acquire("after the stalled "+k.String(), name, m, longLease)
				b.wantNotAcquired(m.ID+" after the stalled "+k.String(), res, idemdriver.StateInProgress)
				b.expire(name, m.ID)
			}
			out := b.process(m.ID+", redelivered after the stall", c, m, ok, idem.Processed, nil)
			if out.Attempt != wantAttempt {
				t.Errorf("%s, redelivered after the stall: attempt %d, want %d", m.ID, out.Attempt, wantAttempt)
			}
		}
		b.wantRecords("after the redeliveries", name, n)
	}
}

// stallHandler is the handler of a delivery whose call of kind k
// stalls: one that saves a recovery point when k is SaveStep, fails when
// k is Release (so that the attempt is released), and succeeds
// otherwise. It counts its calls.
func stallHandler(k stallKind, calls *atomic.Int64) idem.LeaseHandler {
	return func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
		calls.Add(1)
		switch k {
		case stallRelease:
			return idem.Result{}, errBoom
		case stallSaveStep:
			if _, err := a.Step(ctx, "s", func(context.Context) ([]byte, error) { return []byte("v"), nil }); err != nil {
				return idem.Result{}, err
			}
		}
		return idem.Result{Body: []byte("ok")}, nil
	}
}

// stallRenewal holds an attempt at m while its renewals stall: Valid's
// (kind Renew) and the scheduler's, every Lease/3, each ending at the
// store timeout; the lease's local deadline stays where the Acquire put
// it (no renewal landed), and the attempt, still the record's owner,
// completes once the stall ends.
func stallRenewal(t *testing.T, c *idem.LeaseConsumer, w *stallStore, m idem.Message, calls *atomic.Int64) {
	w.armed.Store(false)
	a, out, err := c.Acquire(context.Background(), m, idem.AcquireOptions{})
	if a == nil {
		t.Fatalf("Acquire: %v %v", out, err)
	}
	calls.Add(1)
	dl := a.Deadline()
	w.armed.Store(true)
	if w.kind == stallRenew {
		start := time.Now()
		if err := a.Valid(context.Background()); err != nil {
			t.Errorf("Valid with the renewal stalled, the lease ahead: %v, want nil", err)
		}
		if took := time.Since(start); took != leaseStallTimeout {
			t.Errorf("Valid with the renewal stalled took %v, want the store timeout (%v)", took, leaseStallTimeout)
		}
	}
	// Past the first scheduled renewal (Lease/3) and its store timeout.
	time.Sleep(10*time.Second + leaseStallTimeout + time.Second)
	if !a.Deadline().Equal(dl) {
		t.Errorf("lease deadline %v after stalled renewals, want %v (none landed)", a.Deadline(), dl)
	}
	w.armed.Store(false)
	if out, err := a.Complete(context.Background(), idem.Result{Body: []byte("ok")}); err != nil || out.Status != idem.Processed {
		t.Errorf("Complete after the stalled renewals: %v, %v; want processed", out.Status, err)
	}
}

// checkStalled checks the calls that stalled: at least one (two for a
// renewal, Valid's and the scheduler's; a batch of two or more when
// batched), each on a context whose deadline was at most the store
// timeout from its start, ended at that deadline.
func (s *stallStore) checkStalled(t *testing.T, k stallKind, batched bool) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	want, batch := 1, 0
	if k == stallRenew {
		want = 2
	}
	for i, c := range s.stalled {
		what := fmt.Sprintf("stalled %v call %d (%d calls)", k, i, c.n)
		switch {
		case !c.hasDeadline:
			t.Errorf("%s: its context had no deadline", what)
		case c.deadline.After(c.start.Add(leaseStallTimeout)):
			t.Errorf("%s: deadline %v after its start, want at most the store timeout (%v)", what, c.deadline.Sub(c.start), leaseStallTimeout)
		case !c.end.Equal(c.deadline):
			t.Errorf("%s: ended %v after its start, its deadline %v after it", what, c.end.Sub(c.start), c.deadline.Sub(c.start))
		}
		batch = max(batch, c.n)
	}
	if len(s.stalled) < want {
		t.Errorf("%d %v calls stalled, want at least %d", len(s.stalled), k, want)
	}
	if batched && batch < 2 {
		t.Errorf("no batch of %v calls stalled (largest %d), want one of 2 or more", k, batch)
	}
}

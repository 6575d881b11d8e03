package idem_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/leasebatch"
)

// slowBatcher is a LeaseBatcher over the memory store whose Acquire and
// AcquireBatch calls each take the next of delays (on the clock: in a
// synctest bubble, exactly; no delay once they are used up) unless their
// context ends first: the call then returns the context's error without
// reaching the store. It records the deadline each of those calls had.
type slowBatcher struct {
	*idem.MemoryStore

	mu        sync.Mutex
	delays    []time.Duration
	deadlines []time.Time // zero: none
}

func (s *slowBatcher) wait(ctx context.Context) error {
	s.mu.Lock()
	dl, _ := ctx.Deadline()
	s.deadlines = append(s.deadlines, dl)
	var d time.Duration
	if len(s.delays) > 0 {
		d, s.delays = s.delays[0], s.delays[1:]
	}
	s.mu.Unlock()
	if d == 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *slowBatcher) Acquire(ctx context.Context, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	if err := s.wait(ctx); err != nil {
		return idemdriver.AcquireResult{}, err
	}
	return s.MemoryStore.Acquire(ctx, p)
}

func (s *slowBatcher) AcquireBatch(ctx context.Context, ps []*idemdriver.AcquireParams) ([]idemdriver.AcquireResult, []error, error) {
	if err := s.wait(ctx); err != nil {
		return nil, nil, err
	}
	return s.MemoryStore.AcquireBatch(ctx, ps)
}

// TestLeaseStoreTimeoutPastUnixNano: a StoreTimeout of math.MaxInt64 (no
// practical bound) ends past what a deadline in Unix nanoseconds holds;
// the store still sees a deadline in the future, not one wrapped into the
// past (which ended every batch of leasebatch at once, each delivery
// failing after a second), and the deliveries are processed.
func TestLeaseStoreTimeoutPastUnixNano(t *testing.T) {
	s := &slowBatcher{MemoryStore: idem.NewMemoryStore(nil)}
	c, err := idem.NewLeaseConsumer(leasebatch.New(s, 8), idem.Config{Name: "c", Lease: time.Minute, Coalesce: 1,
		StoreTimeout: math.MaxInt64, PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	start := time.Now()
	msg := idem.Message{ID: "m", Payload: []byte("p")}
	ran := 0
	for _, want := range []idem.Status{idem.Processed, idem.Duplicate} {
		out, err := c.Process(context.Background(), msg, func(context.Context, *idem.Attempt) (idem.Result, error) {
			ran++
			return idem.Result{Body: []byte("ok")}, nil
		})
		if err != nil || out.Status != want {
			t.Fatalf("Process: %v, %v; want %v", out.Status, err, want)
		}
	}
	if ran != 1 {
		t.Errorf("handler ran %d times, want 1", ran)
	}
	if len(s.deadlines) != 2 {
		t.Fatalf("%d Acquire calls, want 2", len(s.deadlines))
	}
	for i, dl := range s.deadlines {
		if !dl.After(start.Add(100 * 365 * 24 * time.Hour)) {
			t.Errorf("Acquire %d: deadline %v, want one more than a century ahead", i, dl)
		}
	}
}

// delivery is one message given to Process in a synctest bubble at a
// time after the start, under a context of its own.
type delivery struct {
	id    string
	at    time.Duration                                // when it starts, from the bubble's start
	ctx   func() (context.Context, context.CancelFunc) // nil: context.Background()
	out   idem.Outcome
	err   error
	took  time.Duration
	ended time.Duration // from the bubble's start
}

// runDeliveries runs ds on c at once (each from its own at), in a
// synctest bubble, counting the handler's runs per message.
func runDeliveries(c *idem.LeaseConsumer, ds []*delivery, ran map[string]int) {
	var mu sync.Mutex
	start := time.Now()
	var wg sync.WaitGroup
	for _, d := range ds {
		wg.Go(func() {
			time.Sleep(d.at) // the bubble's clock: the arrival, not a wait for another goroutine
			ctx := context.Background()
			if d.ctx != nil {
				var cancel context.CancelFunc
				ctx, cancel = d.ctx()
				defer cancel()
			}
			t0 := time.Now()
			d.out, d.err = c.Process(ctx, idem.Message{ID: d.id, Payload: []byte("p")}, func(context.Context, *idem.Attempt) (idem.Result, error) {
				mu.Lock()
				ran[d.id]++
				mu.Unlock()
				return idem.Result{Body: []byte("ok")}, nil
			})
			d.took, d.ended = time.Since(t0), time.Since(start)
		})
	}
	wg.Wait()
}

// TestLeaseBatchLateCaller: a call that joins a batch of leasebatch
// whose runner has an earlier deadline (the runner waited for the batch
// before, or its caller's deadline is sooner) fails at that deadline,
// before its own store timeout, although the store (slow, not stalled)
// would have answered it in time: an error matching ErrStore and
// context.DeadlineExceeded (logged: whether it matches ErrStoreTimeout
// too; it does not, its own store timeout had not passed), nothing acknowledged (the handler did not run, no
// record), and its redelivery is processed at attempt 1. The same without
// a store timeout (negative), the runner bounded by its caller's deadline.
func TestLeaseBatchLateCaller(t *testing.T) {
	const T = 2 * time.Second                                    // StoreTimeout
	halfSecond := func() (context.Context, context.CancelFunc) { // a caller's deadline
		return context.WithTimeout(context.Background(), 500*time.Millisecond)
	}
	for _, tc := range []struct {
		name   string
		delays []time.Duration // of the Acquire calls: the first alone, then the batch
		runner *delivery       // the first to wait: it runs the batch
		late   *delivery       // joins the batch
		// the runner's outcome: ErrStoreTimeout (its own store timeout)
		// or its caller's deadline
		runnerErr error
		lateEnds  time.Duration // from the start: the runner's deadline
		// StoreTimeout: T when 0
		storeTimeout time.Duration
	}{
		{
			// The first call takes 1.6s, the batch would too: it
			// ends at the runner's store timeout, 2.5s; the late call's
			// own would have been 3.5s, after the batch's answer (3.2s).
			name:      "RunnerStoreTimeout",
			delays:    []time.Duration{1600 * time.Millisecond, 1600 * time.Millisecond},
			runner:    &delivery{id: "runner", at: 500 * time.Millisecond},
			late:      &delivery{id: "late", at: 1500 * time.Millisecond},
			runnerErr: idem.ErrStoreTimeout,
			lateEnds:  2500 * time.Millisecond,
		},
		{
			// The runner's caller gives it 0.5s: its deadline passes
			// while it waits for the first call (1s), and the batch,
			// handed to it then, ends at once, the late call with it
			// (the store is not slow for it).
			name:      "RunnerCallerDeadline",
			delays:    []time.Duration{time.Second},
			runner:    &delivery{id: "runner", at: 200 * time.Millisecond, ctx: halfSecond},
			late:      &delivery{id: "late", at: 400 * time.Millisecond},
			runnerErr: context.DeadlineExceeded,
			lateEnds:  time.Second,
		},
		{
			// The same without a store timeout: the calls' contexts
			// are their callers', the runner's deadline its caller's.
			name:         "NoStoreTimeout",
			delays:       []time.Duration{time.Second},
			runner:       &delivery{id: "runner", at: 200 * time.Millisecond, ctx: halfSecond},
			late:         &delivery{id: "late", at: 400 * time.Millisecond},
			runnerErr:    context.DeadlineExceeded,
			lateEnds:     time.Second,
			storeTimeout: -1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := &slowBatcher{MemoryStore: idem.NewMemoryStore(nil), delays: tc.delays}
				st := tc.storeTimeout
				if st == 0 {
					st = T
				}
				c, err := idem.NewLeaseConsumer(leasebatch.New(s, 8), idem.Config{Name: "c", Lease: time.Minute, Coalesce: 1,
					StoreTimeout: st, PurgeInterval: -1})
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = c.Close() }()
				first := &delivery{id: "first"}
				ran := map[string]int{}
				runDeliveries(c, []*delivery{first, tc.runner, tc.late}, ran)
				if first.out.Status != idem.Processed || first.err != nil {
					t.Errorf("first: %v, %v; want processed", first.out.Status, first.err)
				}
				r, l := tc.runner, tc.late
				if r.out.Status != idem.Failed || !errors.Is(r.err, idem.ErrStore) || !errors.Is(r.err, tc.runnerErr) || !errors.Is(r.err, context.DeadlineExceeded) {
					t.Errorf("runner: %v, %v; want failed, ErrStore, context.DeadlineExceeded and %v", r.out.Status, r.err, tc.runnerErr)
				}
				if l.out.Status != idem.Failed || !errors.Is(l.err, idem.ErrStore) || !errors.Is(l.err, context.DeadlineExceeded) {
					t.Errorf("late: %v, %v; want failed, ErrStore and context.DeadlineExceeded", l.out.Status, l.err)
				}
				if l.ended != tc.lateEnds || l.took >= T {
					t.Errorf("late: ended at %v (after %v); want at the runner's deadline, %v, before its own store timeout", l.ended, l.took, tc.lateEnds)
				}
				t.Logf("late: %v after %v (ErrStoreTimeout: %v)", l.err, l.took, errors.Is(l.err, idem.ErrStoreTimeout))
				if ran[r.id] != 0 || ran[l.id] != 0 || idem.CountRecords(s.MemoryStore, "c") != 1 {
					t.Errorf("handler ran %v, %d records; want only first's, 1 record", ran, idem.CountRecords(s.MemoryStore, "c"))
				}
				// Redelivered: processed, the failed Acquire left nothing.
				runDeliveries(c, []*delivery{{id: r.id}, {id: l.id}}, ran)
				if ran[r.id] != 1 || ran[l.id] != 1 || idem.CountRecords(s.MemoryStore, "c") != 3 {
					t.Errorf("after the redeliveries: handler ran %v, %d records; want once each, 3", ran, idem.CountRecords(s.MemoryStore, "c"))
				}
			})
		})
	}
}

// TestLeaseBatchRunnerCancelled: the caller of the call that runs a
// batch of leasebatch leaves (its context cancelled) while it waits for
// the batch ahead: the batch still goes to the store under its deadline,
// and the other call in it is processed. The leaving caller's message is
// not acknowledged unless its handler ran.
func TestLeaseBatchRunnerCancelled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &slowBatcher{MemoryStore: idem.NewMemoryStore(nil), delays: []time.Duration{time.Second, 500 * time.Millisecond}}
		c, err := idem.NewLeaseConsumer(leasebatch.New(s, 8), idem.Config{Name: "c", Lease: time.Minute, Coalesce: 1,
			StoreTimeout: 2 * time.Second, PurgeInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = c.Close() }()
		start := time.Now()
		first := &delivery{id: "first"}
		runner := &delivery{id: "runner", at: 200 * time.Millisecond, ctx: func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(400*time.Millisecond, cancel) // the caller leaves as the batch ahead runs
			return ctx, cancel
		}}
		other := &delivery{id: "other", at: 400 * time.Millisecond}
		ran := map[string]int{}
		runDeliveries(c, []*delivery{first, runner, other}, ran)
		for _, d := range []*delivery{first, other} {
			if d.out.Status != idem.Processed || d.err != nil || ran[d.id] != 1 {
				t.Errorf("%s: %v, %v, handler ran %d times; want processed, once", d.id, d.out.Status, d.err, ran[d.id])
			}
		}
		if other.ended != 1500*time.Millisecond {
			t.Errorf("other ended at %v, want 1.5s (the batch after the first call)", other.ended)
		}
		// Its Acquire went in the batch and held the message: its
		// handler ran, on a context its caller had cancelled.
		t.Logf("runner: %v, %v, handler ran %d times, ended at %v", runner.out.Status, runner.err, ran[runner.id], runner.ended)
		processed := 2
		if runner.out.Status == idem.Processed {
			processed++
		}
		if ran[runner.id] != processed-2 || idem.CountRecords(s.MemoryStore, "c") != processed {
			t.Errorf("runner %v, its handler ran %d times, %d records; want a record exactly for each processed message",
				runner.out.Status, ran[runner.id], idem.CountRecords(s.MemoryStore, "c"))
		}
		if want := start.Add(2200 * time.Millisecond); len(s.deadlines) != 2 || !s.deadlines[1].Equal(want) {
			t.Errorf("store calls' deadlines %v, want 2, the batch's the runner's (%v)", s.deadlines, want)
		}
	})
}

// deriveStore is a lease store whose Acquire and Complete derive
// contexts from the engine's, as a driver does: one with a longer
// timeout than the call's, and one shorter; Complete stalls on the longer
// one while stall is set (set between deliveries). It records their deadlines and, from a
// goroutine of its own that is not waited for, the call's deadline as
// the call ends (a driver's watcher reading it late).
type deriveStore struct {
	*idem.MemoryStore
	stall bool

	mu                sync.Mutex
	start, call, long []time.Time
	short             []time.Duration // from the call's start
	causes            []error         // of the stalled longer context
	late              chan time.Time
}

func (s *deriveStore) derive(ctx context.Context, stall bool) error {
	start := time.Now()
	call, _ := ctx.Deadline()
	long, cancel := context.WithTimeout(ctx, time.Hour)
	defer cancel()
	ldl, _ := long.Deadline()
	short, scancel := context.WithTimeout(ctx, time.Millisecond)
	sdl, _ := short.Deadline()
	scancel()
	go func() {
		dl, _ := ctx.Deadline()
		s.late <- dl
	}()
	s.mu.Lock()
	s.start, s.call, s.long, s.short = append(s.start, start), append(s.call, call), append(s.long, ldl), append(s.short, sdl.Sub(start))
	s.mu.Unlock()
	if !stall {
		return nil
	}
	<-long.Done()
	s.mu.Lock()
	s.causes = append(s.causes, context.Cause(long))
	s.mu.Unlock()
	return long.Err()
}

func (s *deriveStore) Acquire(ctx context.Context, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	if err := s.derive(ctx, false); err != nil {
		return idemdriver.AcquireResult{}, err
	}
	return s.MemoryStore.Acquire(ctx, p)
}

func (s *deriveStore) Complete(ctx context.Context, p *idemdriver.CompleteParams) error {
	if err := s.derive(ctx, s.stall); err != nil {
		return err
	}
	return s.MemoryStore.Complete(ctx, p)
}

// TestLeaseDerivedContexts: a store that derives contexts from the
// engine's (a *callBound) gets the call's bound: one with a longer
// timeout has the call's deadline (the store timeout from the call's
// start), one shorter its own; read from another goroutine as the call
// ends (run with -race), the deadline is the call's or, once it ended,
// none (the caller gave none). A Complete stalled on the longer context
// ends at the store timeout with ErrStoreTimeout as the derived
// context's cause, and the delivery fails with ErrStore and
// ErrStoreTimeout, the record not completed.
func TestLeaseDerivedContexts(t *testing.T) {
	const T = 2 * time.Second
	synctest.Test(t, func(t *testing.T) {
		s := &deriveStore{MemoryStore: idem.NewMemoryStore(nil), late: make(chan time.Time, 4)}
		c, err := idem.NewLeaseConsumer(s, idem.Config{Name: "c", Lease: time.Minute, StoreTimeout: T, PurgeInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = c.Close() }()
		process := func(id string) (idem.Outcome, error, time.Duration) {
			start := time.Now()
			out, err := c.Process(context.Background(), idem.Message{ID: id, Payload: []byte("p")}, func(context.Context, *idem.Attempt) (idem.Result, error) {
				time.Sleep(time.Second) // the handler's work, on the bubble's clock
				return idem.Result{Body: []byte("ok")}, nil
			})
			return out, err, time.Since(start)
		}
		if out, err, _ := process("m1"); out.Status != idem.Processed || err != nil {
			t.Fatalf("m1: %v, %v; want processed", out.Status, err)
		}
		s.stall = true
		out, err, took := process("m2")
		if out.Status != idem.Failed || !errors.Is(err, idem.ErrStore) || !errors.Is(err, idem.ErrStoreTimeout) || took != time.Second+T {
			t.Errorf("m2, its Complete stalled: %v, %v after %v; want failed, ErrStore and ErrStoreTimeout after the handler and the store timeout (%v)", out.Status, err, took, time.Second+T)
		}
		synctest.Wait()
		close(s.late)
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.call) != 4 {
			t.Fatalf("%d store calls, want 4", len(s.call))
		}
		for i := range s.call {
			want := s.start[i].Add(T)
			if !s.call[i].Equal(want) || !s.long[i].Equal(want) || s.short[i] != time.Millisecond {
				t.Errorf("call %d: deadline %v, the longer derived %v, the shorter %v after the start; want %v, %v, 1ms",
					i, s.call[i], s.long[i], s.short[i], want, want)
			}
		}
		for dl := range s.late {
			if !dl.IsZero() && !dl.Equal(s.start[0].Add(T)) && !dl.Equal(s.start[1].Add(T)) && !dl.Equal(s.start[2].Add(T)) && !dl.Equal(s.start[3].Add(T)) {
				t.Errorf("a deadline read as a call ended: %v, want a call's or none", dl)
			}
		}
		if len(s.causes) != 1 || !errors.Is(s.causes[0], idem.ErrStoreTimeout) {
			t.Errorf("the stalled derived context's causes %v, want ErrStoreTimeout", s.causes)
		}
		if idem.CountRecords(s.MemoryStore, "c") != 2 {
			t.Errorf("%d records, want 2", idem.CountRecords(s.MemoryStore, "c"))
		}
	})
}

// TestLeaseBatchManyStalled: 16 deliveries arriving every 250ms through
// leasebatch (batches of at most 4) while the store stalls every Acquire:
// none outlasts its store timeout (no second of timedOut's wait for a
// context to end: each ends at a deadline, its own or its batch's
// runner's), each fails with ErrStore and context.DeadlineExceeded, and
// with ErrStoreTimeout exactly when it ended at its own store timeout;
// no handler ran and no record was made.
func TestLeaseBatchManyStalled(t *testing.T) {
	const T, n = 2 * time.Second, 16
	synctest.Test(t, func(t *testing.T) {
		delays := make([]time.Duration, 2*n)
		for i := range delays {
			delays[i] = time.Hour // a stall: each call ends with its context
		}
		s := &slowBatcher{MemoryStore: idem.NewMemoryStore(nil), delays: delays}
		c, err := idem.NewLeaseConsumer(leasebatch.New(s, 4), idem.Config{Name: "c", Lease: time.Minute, Coalesce: 1,
			StoreTimeout: T, PurgeInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = c.Close() }()
		ds := make([]*delivery, n)
		for i := range ds {
			ds[i] = &delivery{id: fmt.Sprint("m", i), at: time.Duration(i) * 250 * time.Millisecond}
		}
		ran := map[string]int{}
		runDeliveries(c, ds, ran)
		early := 0
		for _, d := range ds {
			if d.out.Status != idem.Failed || !errors.Is(d.err, idem.ErrStore) || !errors.Is(d.err, context.DeadlineExceeded) {
				t.Errorf("%s: %v, %v; want failed, ErrStore and context.DeadlineExceeded", d.id, d.out.Status, d.err)
			}
			if d.took > T {
				t.Errorf("%s: failed after %v, past its store timeout (%v)", d.id, d.took, T)
			}
			if own := d.took == T; errors.Is(d.err, idem.ErrStoreTimeout) != own {
				t.Errorf("%s: after %v: %v; want ErrStoreTimeout exactly when it ended at its store timeout", d.id, d.took, d.err)
			}
			if d.took < T {
				early++
			}
		}
		t.Logf("%d of %d deliveries ended before their own store timeout, at their batch's", early, n)
		if len(ran) != 0 || idem.CountRecords(s.MemoryStore, "c") != 0 {
			t.Errorf("handler ran %v, %d records; want none", ran, idem.CountRecords(s.MemoryStore, "c"))
		}
	})
}

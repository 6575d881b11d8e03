package idem_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// timedRenewStore answers every renewal after rtt (fake time), failing
// when its context ends first, and counts the renewals of each message
// in flight at once and in all.
type timedRenewStore struct {
	*idem.MemoryStore
	rtt time.Duration

	mu      sync.Mutex
	flying  map[string]int
	overlap int // renewals sent while another of the same message was in flight
	renewed int // renewals the store applied
	most    int // renewals in flight at once, all messages
	now     int
}

func newTimedRenewStore(rtt time.Duration) *timedRenewStore {
	return &timedRenewStore{MemoryStore: idem.NewMemoryStore(nil), rtt: rtt, flying: map[string]int{}}
}

func (s *timedRenewStore) Renew(ctx context.Context, p *idemdriver.RenewParams) error {
	s.mu.Lock()
	if s.flying[p.MessageID] > 0 {
		s.overlap++
	}
	s.flying[p.MessageID]++
	s.now++
	s.most = max(s.most, s.now)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.flying[p.MessageID]--
		s.now--
		s.mu.Unlock()
	}()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(s.rtt):
	}
	err := s.MemoryStore.Renew(ctx, p)
	if err == nil {
		s.mu.Lock()
		s.renewed++
		s.mu.Unlock()
	}
	return err
}

// RenewsBatches is false: the scheduler sends its renewals one by one,
// through Renew above, not through the memory store's RenewBatch.
func (s *timedRenewStore) RenewsBatches() bool { return false }

// timedBatchStore is timedRenewStore renewing in batches: each RenewBatch
// is one round trip of rtt (fake time) for all its leases, counted in
// batches; the renewals in flight are counted per lease, as Renew counts
// them.
type timedBatchStore struct {
	*timedRenewStore
	batches int // RenewBatch calls
}

func (s *timedBatchStore) RenewsBatches() bool { return true }

func (s *timedBatchStore) RenewBatch(ctx context.Context, ps []idemdriver.RenewParams) ([]error, error) {
	s.mu.Lock()
	s.batches++
	for _, p := range ps {
		if s.flying[p.MessageID] > 0 {
			s.overlap++
		}
		s.flying[p.MessageID]++
	}
	s.now += len(ps)
	s.most = max(s.most, s.now)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		for _, p := range ps {
			s.flying[p.MessageID]--
		}
		s.now -= len(ps)
		s.mu.Unlock()
	}()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(s.rtt):
	}
	errs, err := s.MemoryStore.RenewBatch(ctx, ps)
	s.mu.Lock()
	for _, e := range errs {
		if e == nil {
			s.renewed++
		}
	}
	s.mu.Unlock()
	return errs, err
}

// TestBreakRenewalsAllSlow: every renewal of 600 attempts (200 at MinLease)
// acquired at once takes longer than slowRenewal (Lease/100), so each one in flight stops
// counting towards MaxRenewers while the rest wait. The store answers each
// in rtt, well within the lease: no attempt may lose its lease over three
// leases, no attempt may have two renewals in flight at once, the
// renewal goroutines stay within MaxRenewers plus one per held attempt,
// and none is left once every attempt completed. MinLease (100ms) makes
// slowRenewal 1ms. Each case runs with renewals sent one by one and in
// batches (a store that is an idemdriver.LeaseBatchRenewer, whose batch is
// one round trip of rtt).
func TestBreakRenewalsAllSlow(t *testing.T) {
	skipUnderRace(t)
	for _, tc := range []struct {
		lease, rtt time.Duration
		n          int
		batchOnly  bool
	}{
		{3 * time.Second, 3 * time.Second / 50, 600, false},
		// 200 attempts at MinLease: with 600, this test run after
		// TestBreakRenewalsManyStuck under -race -count=3 crashed the race
		// runtime (SIGSEGV in __sanitizer::StackDepotBase::Put), on the
		// scheduler before and after the fix alike.
		{idem.MinLease, idem.MinLease / 50, 200, false},
		// A round trip of 5ms at MinLease: five times slowRenewal.
		{idem.MinLease, 5 * time.Millisecond, 200, false},
		// Slower than a tick (Lease/3) but within the lease: the renewal
		// lands after its next tick came, and the next goes at once.
		// This lost 36 of 100 leases while the scheduler started a
		// goroutine only while it counted fewer workers than renewals
		// queued: a worker demoted after slowRenewal left 15 counted ones,
		// all in flight for 1.3s, beside 15 queued renewals, and none of
		// those was sent until a renewal returned or the next tick came
		// (up to a second later, past some attempts' deadlines).
		{3 * time.Second, 3*time.Second/3 + 3*time.Second/10, 100, false},
		// The same with 600 attempts: the scheduler starts at most
		// MaxRenewers renewals per slowRenewal, so the last of 600 is sent
		// 600/16 x Lease/100 (0.375 Lease) after they came due, and with
		// a round trip of 0.43 Lease lands after the attempt's deadline
		// (Lease/3 + 0.375 Lease + 0.43 Lease > Lease): 216 of 600 lose
		// their leases although the store answers each well within one.
		// A store that renews in batches (idemdriver.LeaseBatchRenewer)
		// sends the 600 in two round trips, which land in time; only
		// that case runs (batchOnly).
		{3 * time.Second, 3*time.Second/3 + 3*time.Second/10, 600, true},
	} {
		for _, batch := range []bool{false, true} {
			if tc.batchOnly && !batch {
				continue
			}
			mode := "one-by-one"
			if batch {
				mode = "batches"
			}
			t.Run(fmt.Sprintf("lease-%v/rtt-%v/%d/%s", tc.lease, tc.rtt, tc.n, mode), func(t *testing.T) {
				testRenewalsAllSlow(t, tc.lease, tc.rtt, tc.n, batch)
			})
		}
	}
}

// testRenewalsAllSlow is a case of TestBreakRenewalsAllSlow: n attempts
// acquired at once, every renewal answered in rtt, one by one or in
// batches (timedBatchStore).
func testRenewalsAllSlow(t *testing.T, lease, rtt time.Duration, n int, batch bool) {
	synctest.Test(t, func(t *testing.T) {
		n := stressAttempts(n)
		timed := newTimedRenewStore(rtt)
		var store idemdriver.LeaseStore = timed
		var batches *timedBatchStore
		if batch {
			batches = &timedBatchStore{timedRenewStore: timed}
			store = batches
		}
		c := leaseConsumer(t, store, lease)
		held := acquireMany(t, c, n, 0)
		most := holdWatching(3*6, lease/6)
		lost := countLost(held)
		timed.mu.Lock()
		overlap, renewed, inStore := timed.overlap, timed.renewed, timed.most
		timed.mu.Unlock()
		if lost > 0 {
			t.Errorf("%d of %d attempts lost their lease, whose renewals the store answers in %v (lease %v)", lost, n, rtt, lease)
		}
		if overlap > 0 {
			t.Errorf("%d renewals sent while another of the same attempt was in flight", overlap)
		}
		if bound := idem.MaxRenewers + n; most > bound {
			t.Errorf("%d renewal goroutines at most; want at most %d", most, bound)
		}
		// Three leases: at least one renewal per lease per attempt.
		if renewed < 3*n {
			t.Errorf("%d renewals applied in three leases; want at least %d", renewed, 3*n)
		}
		for _, a := range held {
			if _, err := a.Complete(t.Context(), idem.Result{}); err != nil {
				t.Fatalf("Complete %s: %v", a.Message.ID, err)
			}
		}
		synctest.Wait()
		if left := renewers(); left > 0 {
			t.Errorf("%d renewal goroutines left after every attempt completed", left)
		}
		if batch {
			// Three leases, a renewal every Lease/3: 9 ticks of
			// at most two batches each, plus the renewals sent
			// again at once after a slow one (missed ticks).
			timed.mu.Lock()
			rt := batches.batches
			timed.mu.Unlock()
			if rt > 4*9 {
				t.Errorf("%d batch round trips for %d attempts over three leases; want at most %d", rt, n, 4*9)
			}
			t.Logf("%d batch round trips", rt)
		}
		t.Logf("lease %v rtt %v: %d renewals applied, at most %d goroutines, %d renewals in the store at once", lease, rtt, renewed, most, inStore)
	})
}

// TestBreakRenewalsRemovedWhileSlow: renewals that stall in the store
// until their context ends, 40 of them due at once (more than
// MaxRenewers, so some are demoted after slowRenewal and others still
// queued); half the attempts complete and half release while their
// renewals are demoted, queued or in flight. Each Complete and Release
// returns, its record is in the state it wrote, and no renewal goroutine
// is left.
func TestBreakRenewalsRemovedWhileSlow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease, n = 3 * time.Second, 40
		mem := idem.NewMemoryStore(nil)
		store := &stuckRenewStore{MemoryStore: mem, stuck: "m-"}
		c := leaseConsumer(t, store, lease)
		held := acquireMany(t, c, n, 0)
		// Past the first tick and a few slowRenewals: 16 in flight
		// demoted, more sent, the rest queued.
		time.Sleep(lease/3 + 3*lease/100 + time.Millisecond)
		synctest.Wait()
		if got := renewers(); got <= idem.MaxRenewers {
			t.Fatalf("%d renewal goroutines; want more than MaxRenewers (renewals demoted)", got)
		}
		gaveUp := errors.New("handler gave up")
		for i, a := range held {
			if i%2 == 0 {
				if _, err := a.Complete(t.Context(), idem.Result{Body: []byte("done")}); err != nil {
					t.Fatalf("Complete %s: %v", a.Message.ID, err)
				}
			} else if out, err := a.Release(t.Context(), gaveUp); !errors.Is(err, gaveUp) || out.Status != idem.Failed {
				t.Fatalf("Release %s: %v %v; want Failed with its cause", a.Message.ID, out.Status, err)
			}
		}
		synctest.Wait()
		if left := renewers(); left > 0 {
			t.Errorf("%d renewal goroutines left after every attempt ended", left)
		}
		// Each completed message is a duplicate now; each released one is
		// acquired again at once.
		c2 := leaseConsumer(t, mem, lease)
		for i := range n {
			a, out, err := c2.Acquire(t.Context(), idem.Message{ID: fmt.Sprintf("m-%d", i), Payload: []byte("p")}, idem.AcquireOptions{})
			switch {
			case i%2 == 0 && (a != nil || err != nil || out.Status != idem.Duplicate || string(out.Result) != "done"):
				t.Errorf("m-%d completed: Acquire %v %+v %v; want Duplicate with its stored result", i, a, out, err)
			case i%2 == 1 && a == nil:
				t.Errorf("m-%d released: Acquire %v %v; want a new attempt", i, out, err)
			}
			if a != nil {
				_, _ = a.Release(t.Context(), errors.New("done"))
			}
		}
	})
}

package idem_test

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// countingStore counts the renewals that reach the memory store.
type countingStore struct {
	*idem.MemoryStore
	renews atomic.Int64
}

func (s *countingStore) Renew(ctx context.Context, p *idemdriver.RenewParams) error {
	s.renews.Add(1)
	return s.MemoryStore.Renew(ctx, p)
}

// RenewsBatches is false: the scheduler sends its renewals one by one,
// through Renew above, not through the memory store's RenewBatch.
func (s *countingStore) RenewsBatches() bool { return false }

// Renewals cost no goroutine per message: holding 50, or 10,000,
// attempts adds no goroutine (the consumer's one timer schedules every
// renewal), and none is left when they end. Every attempt is renewed
// every Lease/3, on time: after three leases none has lost its lease, and
// each was renewed about 9 times. The live heap per held attempt is
// logged (memory store records included). Not parallel: it counts the
// goroutines of its synctest bubble (bubbleGoroutines), and no other test
// may run one meanwhile.
//
// With a store that renews in batches (countingBatchStore, the memory
// store's RenewBatch), the same holds, and the renewals of 10,000 attempts
// cost a few store round trips per tick: at most Lease/renewWindow (30)
// batch sends of at most maxRenewBatch (500) renewals per lease, where one
// by one they cost one per renewal (30,000 per lease).
func TestRenewalsNoGoroutinePerMessage(t *testing.T) {
	for _, batch := range []bool{false, true} {
		for _, n := range []int{50, 10000} {
			if n > 50 && testing.Short() {
				continue
			}
			if batch {
				n = stressAttempts(n)
			}
			t.Run(fmt.Sprintf("%d/batches-%v", n, batch), func(t *testing.T) { testRenewalsHeld(t, n, batch) })
		}
	}
}

// countingBatchStore is countingStore renewing in batches: renews counts
// the leases renewed, batches the RenewBatch calls (round trips).
type countingBatchStore struct {
	*countingStore
	batches atomic.Int64
}

func (s *countingBatchStore) RenewsBatches() bool { return true }

func (s *countingBatchStore) RenewBatch(ctx context.Context, ps []idemdriver.RenewParams) ([]error, error) {
	s.batches.Add(1)
	s.renews.Add(int64(len(ps)))
	return s.MemoryStore.RenewBatch(ctx, ps)
}

func testRenewalsHeld(t *testing.T, n int, batch bool) {
	synctest.Test(t, func(t *testing.T) {
		const lease = 3 * time.Second
		counted := &countingStore{MemoryStore: idem.NewMemoryStore(nil)}
		var store idemdriver.LeaseStore = counted
		var batches *countingBatchStore
		if batch {
			batches = &countingBatchStore{countingStore: counted}
			store = batches
		}
		c := leaseConsumer(t, store, lease)
		synctest.Wait() // the consumer's loop settled (see bubbleGoroutines)
		before := bubbleGoroutines()
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		heap0 := ms.HeapAlloc
		held := acquireMany(t, c, n, lease/6/time.Duration(n)) // renewal times spread, all after the last Acquire
		synctest.Wait()
		if got := bubbleGoroutines() - before; got > 0 {
			t.Errorf("%d attempts held: %d more goroutines, want none", n, got)
		}
		runtime.GC()
		runtime.ReadMemStats(&ms)
		t.Logf("%d attempts held: %d goroutines more than before, live heap %d B per attempt (the memory store's records included)",
			n, bubbleGoroutines()-before, (int64(ms.HeapAlloc)-int64(heap0))/int64(n))
		time.Sleep(3 * lease)
		synctest.Wait()
		for i, a := range held {
			if err := a.Context().Err(); err != nil {
				t.Errorf("attempt %d: context ended (%v) although every renewal succeeds", i, context.Cause(a.Context()))
			}
			if left := time.Until(a.Deadline()); left < lease*2/3-time.Second {
				t.Errorf("attempt %d: %v of lease left, want at least %v (renewed every Lease/3)", i, left, lease*2/3-time.Second)
			}
		}
		if got, want := counted.renews.Load(), int64(n*9); got < want-int64(n) || got > want+int64(n) {
			t.Errorf("%d renewals of %d attempts over 3 leases, want about %d", got, n, want)
		}
		roundTrips := counted.renews.Load()
		if batch {
			roundTrips = batches.batches.Load()
			// 30 windows per lease, each at most ceil(n/500) batches.
			if most := int64(3 * 30 * ((n + 499) / 500)); roundTrips > most {
				t.Errorf("%d renewal round trips over 3 leases, want at most %d", roundTrips, most)
			}
		}
		t.Logf("%d attempts held: %d renewals in %d store round trips over 3 leases (%.1f round trips per lease)",
			n, counted.renews.Load(), roundTrips, float64(roundTrips)/3)
		for _, a := range held {
			if out, err := a.Complete(t.Context(), idem.Result{Body: []byte("ok")}); err != nil {
				t.Fatalf("Complete: %v %v", out, err)
			}
		}
		synctest.Wait()
		if got := bubbleGoroutines() - before; got > 0 {
			t.Errorf("after every attempt ended: %d more goroutines than before, want 0", got)
		}
		renews := counted.renews.Load()
		time.Sleep(2 * lease)
		if got := counted.renews.Load(); got != renews {
			t.Errorf("%d renewals after every attempt ended, want none", got-renews)
		}
	})
}

// slowRenewStore makes its first renewal take slow (fake time), then
// records when each renewal starts.
type slowRenewStore struct {
	*idem.MemoryStore
	slow   time.Duration
	starts chan time.Time
}

func (s *slowRenewStore) Renew(ctx context.Context, p *idemdriver.RenewParams) error {
	s.starts <- time.Now()
	if len(s.starts) == 1 {
		time.Sleep(s.slow)
	}
	return s.MemoryStore.Renew(ctx, p)
}

// RenewsBatches is false: the scheduler sends its renewals one by one,
// through Renew above, not through the memory store's RenewBatch.
func (s *slowRenewStore) RenewsBatches() bool { return false }

// A renewal slower than Lease/3 (a stalled store or machine) is followed
// at once by the next, as a missed tick is: a lease of 6s renewed at 2s
// by a renewal that takes 3s is renewed again at 5s, not at 6s, so the
// attempt keeps its lease.
func TestRenewalAfterASlowOneGoesAtOnce(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const lease = 6 * time.Second
		store := &slowRenewStore{MemoryStore: idem.NewMemoryStore(nil), slow: 3 * time.Second, starts: make(chan time.Time, 16)}
		c := leaseConsumer(t, store, lease)
		start := time.Now()
		a, out, err := c.Acquire(t.Context(), idem.Message{ID: "m", Payload: []byte("p")}, idem.AcquireOptions{})
		if a == nil {
			t.Fatalf("Acquire: %v %v", out, err)
		}
		time.Sleep(8500 * time.Millisecond) // between renewals, no tie
		synctest.Wait()
		if _, err := a.Complete(t.Context(), idem.Result{}); err != nil {
			t.Fatalf("Complete after a slow renewal: %v", err)
		}
		close(store.starts)
		var got []time.Duration
		for s := range store.starts {
			got = append(got, s.Sub(start))
		}
		want := []time.Duration{2 * time.Second, 5 * time.Second, 7 * time.Second}
		if len(got) != len(want) {
			t.Fatalf("renewals started at %v, want %v", got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("renewals started at %v, want %v", got, want)
			}
		}
	})
}

// bubbleGoroutines counts the goroutines in a synctest bubble, from the
// tracebacks of all goroutines, whose headers name the bubble ("[select
// (durable), synctest bubble 1]"); the calling goroutine, which is
// running, is not counted. runtime.NumGoroutine would also count the
// goroutines of other tests: a timer of an earlier test that fires
// starts one, and made this test fail once. Count after synctest.Wait,
// when every other goroutine of the bubble is durably blocked: one that
// is allocating may be starting a garbage collection or assisting one,
// and the runtime takes it out of its bubble meanwhile (its header then
// names none), so a count taken while the consumer's loop was starting
// came out one short, and a later one "1 more goroutine".
func bubbleGoroutines() int {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return bytes.Count(buf[:n], []byte(", synctest bubble "))
		}
		buf = make([]byte, 2*len(buf))
	}
}

// blockingRenewStore holds every renewal until unblock is closed, and
// counts the renewals that started.
type blockingRenewStore struct {
	*idem.MemoryStore
	unblock chan struct{}
	started atomic.Int64
}

func (s *blockingRenewStore) Renew(ctx context.Context, p *idemdriver.RenewParams) error {
	s.started.Add(1)
	<-s.unblock
	return s.MemoryStore.Renew(ctx, p)
}

// RenewsBatches is false: the scheduler sends its renewals one by one,
// through Renew above, not through the memory store's RenewBatch.
func (s *blockingRenewStore) RenewsBatches() bool { return false }

// Many renewals due at once (attempts acquired in one burst) run on at
// most MaxRenewers goroutines: with every renewal stuck in the store,
// 500 due attempts start MaxRenewers renewals and MaxRenewers goroutines;
// once the store answers, every attempt is renewed and no goroutine is
// left. Not parallel: it counts the goroutines of its synctest bubble.
func TestRenewalsBoundedGoroutines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease, n = 3 * time.Second, 500
		store := &blockingRenewStore{MemoryStore: idem.NewMemoryStore(nil), unblock: make(chan struct{})}
		c := leaseConsumer(t, store, lease)
		synctest.Wait() // the consumer's loop settled (see bubbleGoroutines)
		before := bubbleGoroutines()
		held := acquireMany(t, c, n, 0)
		time.Sleep(lease/3 + time.Millisecond) // every first renewal is due
		synctest.Wait()
		if got := bubbleGoroutines() - before; got != idem.MaxRenewers {
			t.Errorf("%d renewals due at once: %d more goroutines, want %d", n, got, idem.MaxRenewers)
		}
		if got := store.started.Load(); got != idem.MaxRenewers {
			t.Errorf("%d renewals started with the store stuck, want %d", got, idem.MaxRenewers)
		}
		close(store.unblock)
		synctest.Wait()
		if got := store.started.Load(); got != n {
			t.Errorf("%d renewals once the store answers, want %d", got, n)
		}
		if got := bubbleGoroutines() - before; got != 0 {
			t.Errorf("after the renewals: %d more goroutines, want 0", got)
		}
		for i, a := range held {
			if out, err := a.Complete(t.Context(), idem.Result{}); err != nil {
				t.Fatalf("Complete %d: %v %v", i, out, err)
			}
		}
	})
}

// acquireMany acquires n messages m-0, m-1, ... on c, sleeping gap after
// each Acquire.
func acquireMany(t *testing.T, c *idem.LeaseConsumer, n int, gap time.Duration) []*idem.Attempt {
	t.Helper()
	held := make([]*idem.Attempt, 0, n)
	for i := range n {
		a, out, err := c.Acquire(t.Context(), idem.Message{ID: fmt.Sprintf("m-%d", i), Payload: []byte("p")}, idem.AcquireOptions{})
		if a == nil {
			t.Fatalf("Acquire %d: %v %v", i, out, err)
		}
		held = append(held, a)
		time.Sleep(gap)
	}
	return held
}

package idem_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// A lease taken over while its attempt is held fails in its batch for that
// attempt only: of 20 attempts renewed in one batch per tick, the one
// whose record another process took over learns it (its context ends with
// ErrLeaseLost, its Complete is refused), the other 19 keep their leases
// and complete, and the new owner's lease and token stand. Not parallel:
// it counts the renewal goroutines of the process (renewers).
func TestRenewBatchTakenOverFailsThatAttemptOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease, n, over = 3 * time.Second, 20, 7
		mem := idem.NewMemoryStore(nil)
		store := &countingBatchStore{countingStore: &countingStore{MemoryStore: mem}}
		c := leaseConsumer(t, store, lease)
		held := acquireMany(t, c, n, 0)
		id := held[over].Message.ID
		if !idem.ExpireLease(mem, "c", id) {
			t.Fatalf("ExpireLease %s: no record", id)
		}
		fp, _ := idem.SHA256Fingerprint([]byte("p"))
		res, err := mem.Acquire(t.Context(), &idemdriver.AcquireParams{Consumer: "c", MessageID: id, Fingerprint: fp, Lease: lease})
		if err != nil || !res.Acquired || res.Token <= held[over].Token {
			t.Fatalf("takeover of %s: %+v %v; want acquired with a newer token", id, res, err)
		}
		time.Sleep(lease/3 + time.Millisecond)
		synctest.Wait()
		if cause := context.Cause(held[over].Context()); !errors.Is(cause, idem.ErrLeaseLost) {
			t.Errorf("taken-over attempt: context cause %v, want ErrLeaseLost", cause)
		}
		time.Sleep(lease)
		synctest.Wait()
		for i, a := range held {
			if i == over {
				continue
			}
			if err := a.Context().Err(); err != nil {
				t.Errorf("attempt %d: context ended (%v) beside a taken-over one", i, context.Cause(a.Context()))
			}
		}
		// Every tick is one batch: the first of 20, the later ones of 19.
		if got, ticks := store.batches.Load(), int64(4); got != ticks {
			t.Errorf("%d renewal round trips in %d ticks, want one per tick", got, ticks)
		}
		if _, err := held[over].Complete(t.Context(), idem.Result{}); !errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("Complete of the taken-over attempt: %v, want ErrLeaseLost", err)
		}
		if err := mem.Complete(t.Context(), &idemdriver.CompleteParams{Consumer: "c", MessageID: id, Token: res.Token, Result: []byte("new owner")}); err != nil {
			t.Errorf("Complete by the new owner: %v", err)
		}
		for i, a := range held {
			if i == over {
				continue
			}
			if _, err := a.Complete(t.Context(), idem.Result{}); err != nil {
				t.Errorf("Complete %s: %v", a.Message.ID, err)
			}
		}
		synctest.Wait()
		if left := renewers(); left > 0 {
			t.Errorf("%d renewal goroutines left after every attempt ended", left)
		}
	})
}

// stallBatchStore renews in batches; a batch holding a lease whose ID has
// the prefix stuck stalls until its context ends (a store whose answer
// does not come), the others take rtt (fake time).
type stallBatchStore struct {
	*idem.MemoryStore
	stuck string
	rtt   time.Duration
}

func (s *stallBatchStore) RenewsBatches() bool { return true }

func (s *stallBatchStore) RenewBatch(ctx context.Context, ps []idemdriver.RenewParams) ([]error, error) {
	for _, p := range ps {
		if strings.HasPrefix(p.MessageID, s.stuck) {
			<-ctx.Done()
			return nil, ctx.Err()
		}
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(s.rtt):
	}
	return s.MemoryStore.RenewBatch(ctx, ps)
}

// A batch whose answer never comes holds back its own renewals only: 100
// attempts acquired first, whose batches stall, and 500 acquired a tenth
// of a lease later (another batch): over three leases the 500 keep their
// leases, the 100 run out at their own deadlines, and the goroutines stay
// within one per batch in flight. Completing the 100 while their batch
// stalls returns at once (Complete does not wait for the batch), and the
// batch is cancelled when its last attempt leaves: no goroutine is left.
func TestRenewBatchStalledHoldsBackItsOwn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = 3 * time.Second
		n, stuckN := stressAttempts(500), stressAttempts(100)
		store := &stallBatchStore{MemoryStore: idem.NewMemoryStore(nil), stuck: "stuck-", rtt: 5 * time.Millisecond}
		c := leaseConsumer(t, store, lease)
		var stalled, healthy []*idem.Attempt
		for i := range stuckN {
			stalled = append(stalled, acquireID(t, c, fmt.Sprintf("stuck-%d", i)))
		}
		time.Sleep(lease / 10)
		for i := range n {
			healthy = append(healthy, acquireID(t, c, fmt.Sprintf("ok-%d", i)))
		}
		most := holdWatching(3*6, lease/6)
		lost := countLost(healthy)
		if lost > 0 {
			t.Errorf("%d of %d attempts lost their lease beside a stalled batch", lost, n)
		}
		for _, a := range stalled {
			if cause := context.Cause(a.Context()); !errors.Is(cause, idem.ErrLeaseLost) {
				t.Fatalf("stalled attempt %s: context cause %v, want ErrLeaseLost (its deadline passed)", a.Message.ID, cause)
			}
		}
		// Batches in flight at once: the stalled ones (one per tick until
		// their attempts ran out) and the healthy ones (one or two).
		if most > 8 {
			t.Errorf("%d renewal goroutines at most; want at most 8", most)
		}
		for _, a := range healthy {
			if _, err := a.Complete(t.Context(), idem.Result{}); err != nil {
				t.Fatalf("Complete %s: %v", a.Message.ID, err)
			}
		}
		for _, a := range stalled {
			_, _ = a.Abandon(t.Context(), nil)
		}
		synctest.Wait()
		if left := renewers(); left > 0 {
			t.Errorf("%d renewal goroutines left after every attempt ended", left)
		}
		t.Logf("%d stalled, %d healthy (%d lost), at most %d goroutines", len(stalled), len(healthy), lost, most)
	})
}

// lockedBatchStore renews in batches and leaves unjudged
// (idemdriver.ErrRenewNotJudged) the leases whose ID has the prefix
// locked, as a batch that skips the rows other transactions hold does;
// their Renew, sent alone, waits hold (the lock), then renews. It counts
// the RenewBatch calls and the Renew calls of locked leases.
type lockedBatchStore struct {
	*idem.MemoryStore
	locked string
	hold   time.Duration

	mu             sync.Mutex
	batches, alone int
}

func (s *lockedBatchStore) RenewsBatches() bool { return true }

func (s *lockedBatchStore) RenewBatch(ctx context.Context, ps []idemdriver.RenewParams) ([]error, error) {
	s.mu.Lock()
	s.batches++
	s.mu.Unlock()
	errs, err := s.MemoryStore.RenewBatch(ctx, ps)
	for i, p := range ps {
		if err == nil && strings.HasPrefix(p.MessageID, s.locked) {
			errs[i] = idemdriver.ErrRenewNotJudged // not renewed (the memory store did; the next Renew does again)
		}
	}
	return errs, err
}

func (s *lockedBatchStore) Renew(ctx context.Context, p *idemdriver.RenewParams) error {
	if strings.HasPrefix(p.MessageID, s.locked) {
		s.mu.Lock()
		s.alone++
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(s.hold):
		}
	}
	return s.MemoryStore.Renew(ctx, p)
}

// Leases a batch leaves unjudged (their records locked by other
// transactions) are renewed alone at once, each waiting for its own
// record: all 60 attempts keep their leases over three leases, the 10
// locked ones renewed alone at every tick (9 times each) and the batch
// sent once per tick. Not parallel: it counts the renewal goroutines of
// the process (renewers).
func TestRenewBatchUnjudgedRenewedAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease, n, locked = 3 * time.Second, 50, 10
		store := &lockedBatchStore{MemoryStore: idem.NewMemoryStore(nil), locked: "locked-", hold: lease / 10}
		c := leaseConsumer(t, store, lease)
		var held []*idem.Attempt
		for i := range n + locked {
			id := fmt.Sprintf("ok-%d", i)
			if i < locked {
				id = fmt.Sprintf("locked-%d", i)
			}
			held = append(held, acquireID(t, c, id))
		}
		time.Sleep(3*lease + time.Millisecond)
		synctest.Wait()
		for _, a := range held {
			if err := a.Context().Err(); err != nil {
				t.Errorf("%s: context ended (%v)", a.Message.ID, context.Cause(a.Context()))
			}
		}
		store.mu.Lock()
		batches, alone := store.batches, store.alone
		store.mu.Unlock()
		if batches != 9 || alone != 9*locked {
			t.Errorf("%d batches and %d renewals alone in 9 ticks; want 9 and %d", batches, alone, 9*locked)
		}
		for _, a := range held {
			if _, err := a.Complete(t.Context(), idem.Result{}); err != nil {
				t.Fatalf("Complete %s: %v", a.Message.ID, err)
			}
		}
		synctest.Wait()
		if left := renewers(); left > 0 {
			t.Errorf("%d renewal goroutines left", left)
		}
	})
}

// Attempts acquired over a whole tick (one every Lease/3/200) are renewed
// in few batches: those due within renewWindow (Lease/30) of the first
// due ride in its batch, so a tick of 200 renewals costs at most 10 round
// trips (one per window), not 200; each renewal goes within a window
// before its tick, never after it.
func TestRenewBatchWindowGathersSpreadRenewals(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const lease, n = 3 * time.Second, 200
		const gap = lease / 3 / n
		counted := &countingStore{MemoryStore: idem.NewMemoryStore(nil)}
		store := &countingBatchStore{countingStore: counted}
		c := leaseConsumer(t, store, lease)
		held := acquireMany(t, c, n, gap)        // attempt i at i*gap
		start := time.Now()                      // n*gap
		time.Sleep(lease/3 - 2*time.Millisecond) // every first tick passed, no second one
		synctest.Wait()
		if got := store.batches.Load(); got > 10 {
			t.Errorf("%d batches for the first tick of %d attempts, want at most 10 (one per window of Lease/30)", got, n)
		}
		if got := counted.renews.Load(); got < n {
			t.Errorf("%d renewals, want at least %d (each attempt once)", got, n)
		}
		// The last renewal of each went within a window before its first
		// tick, or before its second (the last window reaches it).
		for i, a := range held {
			tick := start.Add(-time.Duration(n-i) * gap).Add(lease / 3)
			sent := a.Deadline().Add(-lease)
			early, early2 := tick.Sub(sent), tick.Add(lease/3).Sub(sent)
			if (early < 0 || early > lease/30) && (early2 < 0 || early2 > lease/30) {
				t.Errorf("attempt %d: renewed %v before its first tick, want within [0, %v] of a tick", i, early, lease/30)
			}
		}
		for _, a := range held {
			_, _ = a.Complete(t.Context(), idem.Result{})
		}
	})
}

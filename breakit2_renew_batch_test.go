package idem_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemtest"
)

// gateBatchStore renews in batches. While gate is set, each RenewBatch
// first waits for it to be closed (or its context to end), then renews
// on the memory store; fail, while set, is the error of every batch (the
// store unreachable). It counts batches and the leases they carried.
type gateBatchStore struct {
	*idem.MemoryStore

	mu      sync.Mutex
	gate    chan struct{}
	entered chan struct{} // closed when a batch waits at gate
	fail    error

	batches, leases atomic.Int64
}

func (s *gateBatchStore) RenewsBatches() bool { return true }

func (s *gateBatchStore) RenewBatch(ctx context.Context, ps []idemdriver.RenewParams) ([]error, error) {
	s.batches.Add(1)
	s.leases.Add(int64(len(ps)))
	s.mu.Lock()
	gate, entered, fail := s.gate, s.entered, s.fail
	if entered != nil {
		close(entered)
		s.entered = nil
	}
	s.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if fail != nil {
		return nil, fail
	}
	return s.MemoryStore.RenewBatch(ctx, ps)
}

// hold makes the next batches wait until the returned func is called,
// and returns a channel closed once one of them waits.
func (s *gateBatchStore) hold() (entered chan struct{}, open func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := make(chan struct{})
	s.gate, s.entered = g, make(chan struct{})
	var once sync.Once
	return s.entered, func() {
		once.Do(func() {
			s.mu.Lock()
			s.gate = nil
			s.mu.Unlock()
			close(g)
		})
	}
}

func (s *gateBatchStore) setFail(err error) {
	s.mu.Lock()
	s.fail = err
	s.mu.Unlock()
}

// record reads consumer c's record id from the memory store (an Acquire
// with the payload "p" that finds it).
func record(t *testing.T, mem *idem.MemoryStore, id string) idemdriver.AcquireResult {
	t.Helper()
	fp, _ := idem.SHA256Fingerprint([]byte("p"))
	res, err := mem.Acquire(context.Background(), &idemdriver.AcquireParams{Consumer: "c", MessageID: id, Fingerprint: fp, Lease: time.Second})
	if err != nil || res.Acquired {
		t.Fatalf("record %s: %+v %v; want an existing record", id, res, err)
	}
	return res
}

// Attempts completed, released and abandoned while the batch carrying
// their renewals is in flight: each ending returns at once (the batch is
// not waited for while others ride in it), and the renewal that lands
// after the ending write neither resurrects nor extends anything: the
// completed record stays completed with its result, the released one is
// free (a new Acquire takes it at once), and none of those attempts is
// reported lost. The others of the batch keep their leases and complete.
// No goroutine is left (synctest fails on a leak).
func TestBreakit2EndingWhileBatchInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease, n = 3 * time.Second, 12
		store := &gateBatchStore{MemoryStore: idem.NewMemoryStore(nil)}
		c := leaseConsumer(t, store, lease)
		held := acquireMany(t, c, n, 0)
		entered, open := store.hold()
		defer open()
		time.Sleep(lease/3 + time.Millisecond)
		<-entered
		synctest.Wait()
		if got := store.batches.Load(); got != 1 {
			t.Fatalf("%d batches in flight, want 1", got)
		}
		if _, err := held[0].Complete(t.Context(), idem.Result{Body: []byte("done-0")}); err != nil {
			t.Fatalf("Complete while the batch is in flight: %v", err)
		}
		if out, err := held[1].Release(t.Context(), errors.New("give back")); errors.Is(err, idem.ErrStore) || errors.Is(err, idem.ErrLeaseLost) || out.Poison {
			t.Fatalf("Release while the batch is in flight: %+v %v", out, err)
		}
		if _, err := held[2].Abandon(t.Context(), errors.New("drop")); errors.Is(err, idem.ErrStore) || errors.Is(err, idem.ErrLeaseLost) {
			t.Fatalf("Abandon while the batch is in flight: %v", err)
		}
		open()
		synctest.Wait()
		if r := record(t, store.MemoryStore, held[0].Message.ID); r.State != idemdriver.StateCompleted || string(r.Result) != "done-0" {
			t.Errorf("completed record after the late renewal: %+v", r)
		}
		fp, _ := idem.SHA256Fingerprint([]byte("p"))
		res, err := store.MemoryStore.Acquire(t.Context(), &idemdriver.AcquireParams{Consumer: "c", MessageID: held[1].Message.ID, Fingerprint: fp, Lease: lease})
		if err != nil || !res.Acquired {
			t.Errorf("released record after the late renewal: %+v %v; want free (acquired at once)", res, err)
		}
		// Abandon writes nothing, so fencing cannot refuse the renewal
		// sent before it: the lease may be extended once, by one Lease
		// from the batch's landing, never more.
		if r := record(t, store.MemoryStore, held[2].Message.ID); r.LeaseRemaining > lease {
			t.Errorf("abandoned record after the late renewal: %v of lease left, want at most one lease", r.LeaseRemaining)
		}
		for _, a := range held[:3] {
			if cause := context.Cause(a.Context()); errors.Is(cause, idem.ErrLeaseLost) {
				t.Errorf("%s ended by its own write, then reported lost: %v", a.Message.ID, cause)
			}
		}
		time.Sleep(2 * lease)
		synctest.Wait()
		if lost := countLost(held[3:]); lost > 0 {
			t.Errorf("%d of %d others lost their lease", lost, n-3)
		}
		for _, a := range held[3:] {
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

// One consumer holds two attempts of the same record: the first's lease
// ran out at the store and the consumer took the message again (newer
// token) before the first attempt noticed. Their renewals ride in one
// batch: the old token's fails for the old attempt only (ErrLeaseLost),
// the new one's renews, and the new attempt completes; the old one's
// Complete is refused and the stored result is the new attempt's.
func TestBreakit2SameRecordTwiceInABatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = 3 * time.Second
		store := &gateBatchStore{MemoryStore: idem.NewMemoryStore(nil)}
		c := leaseConsumer(t, store, lease)
		old := acquireID(t, c, "dup")
		others := acquireMany(t, c, 5, 0)
		if !idem.ExpireLease(store.MemoryStore, "c", "dup") {
			t.Fatal("ExpireLease: no record")
		}
		neu := acquireID(t, c, "dup")
		if neu.Token <= old.Token {
			t.Fatalf("new token %d, old %d", neu.Token, old.Token)
		}
		time.Sleep(lease/3 + time.Millisecond)
		synctest.Wait()
		if got := store.batches.Load(); got != 1 || store.leases.Load() != 7 {
			t.Fatalf("%d batches of %d leases, want one of 7 (both attempts of dup in it)", got, store.leases.Load())
		}
		if cause := context.Cause(old.Context()); !errors.Is(cause, idem.ErrLeaseLost) {
			t.Errorf("old attempt: cause %v, want ErrLeaseLost", cause)
		}
		if err := neu.Context().Err(); err != nil {
			t.Errorf("new attempt: context ended (%v)", context.Cause(neu.Context()))
		}
		time.Sleep(lease)
		synctest.Wait()
		if err := neu.Context().Err(); err != nil {
			t.Errorf("new attempt after a lease: context ended (%v)", context.Cause(neu.Context()))
		}
		if _, err := old.Complete(t.Context(), idem.Result{Body: []byte("old")}); !errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("old Complete: %v, want ErrLeaseLost", err)
		}
		if _, err := neu.Complete(t.Context(), idem.Result{Body: []byte("new")}); err != nil {
			t.Errorf("new Complete: %v", err)
		}
		if r := record(t, store.MemoryStore, "dup"); r.State != idemdriver.StateCompleted || string(r.Result) != "new" {
			t.Errorf("dup: %+v; want completed with the new attempt's result", r)
		}
		for _, a := range others {
			if _, err := a.Complete(t.Context(), idem.Result{}); err != nil {
				t.Errorf("Complete %s: %v", a.Message.ID, err)
			}
		}
		synctest.Wait()
	})
}

// A store error of the whole batch (the store unreachable): while it
// lasts less than the lease left, no attempt is reported lost and every
// one is renewed once the store answers again; when it lasts past the
// leases, every attempt's context ends at its own local deadline (none
// kept past it), and the store's records are then free to take over.
func TestBreakit2WholeBatchError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease, n = 3 * time.Second, 30
		store := &gateBatchStore{MemoryStore: idem.NewMemoryStore(nil)}
		c := leaseConsumer(t, store, lease)
		held := acquireMany(t, c, n, 0)
		store.setFail(errors.New("store unreachable"))
		// The tick at 1s fails; the one at 2s renews.
		time.Sleep(lease/3 + time.Millisecond)
		synctest.Wait()
		if lost := countLost(held); lost > 0 {
			t.Fatalf("%d of %d attempts lost after a failed batch, within the lease", lost, n)
		}
		failed := store.batches.Load()
		store.setFail(nil)
		time.Sleep(lease / 3)
		synctest.Wait()
		if store.batches.Load() <= failed {
			t.Fatalf("no batch after the failed one")
		}
		time.Sleep(lease / 2)
		synctest.Wait()
		if lost := countLost(held); lost > 0 {
			t.Fatalf("%d of %d attempts lost once the store answers again", lost, n)
		}
		dl := held[0].Deadline()
		store.setFail(errors.New("store unreachable"))
		time.Sleep(time.Until(dl) - time.Millisecond)
		synctest.Wait()
		if lost := countLost(held); lost > 0 {
			t.Fatalf("%d of %d attempts ended before their deadline", lost, n)
		}
		time.Sleep(2 * time.Millisecond)
		synctest.Wait()
		for _, a := range held {
			if cause := context.Cause(a.Context()); !errors.Is(cause, idem.ErrLeaseLost) {
				t.Fatalf("%s after its deadline with the store down: cause %v, want ErrLeaseLost", a.Message.ID, cause)
			}
		}
		for _, a := range held {
			_, _ = a.Release(t.Context(), nil)
		}
		synctest.Wait()
		if left := renewers(); left > 0 {
			t.Errorf("%d renewal goroutines left", left)
		}
	})
}

// A consumer closed while its batches are in flight (their store call
// never answers): Close returns, and once the attempts end no renewal
// goroutine is left (synctest fails the test on a goroutine left
// blocked in the bubble).
func TestBreakit2CloseWithBatchesInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease, n = 3 * time.Second, 40
		store := &gateBatchStore{MemoryStore: idem.NewMemoryStore(nil)}
		c, err := idem.NewLeaseConsumer(store, idem.Config{Name: "c", Lease: lease, PurgeInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		var held []*idem.Attempt
		for i := range n {
			held = append(held, acquireID(t, c, fmt.Sprintf("x-%d", i)))
			if i == n/2 {
				time.Sleep(lease / 10) // two batches
			}
		}
		entered, _ := store.hold() // never opened
		time.Sleep(lease/3 + time.Millisecond)
		<-entered
		synctest.Wait()
		if err := c.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		time.Sleep(lease / 10)
		synctest.Wait()
		for _, a := range held {
			_, _ = a.Release(context.Background(), nil)
		}
		synctest.Wait()
		if left := renewers(); left > 0 {
			t.Errorf("%d renewal goroutines left after Close and every attempt's end", left)
		}
	})
}

// The memory store's RenewBatch racing Completes of its records
// (idemtest.RenewBatchRacingCompletes).
func TestBreakit2MemoryRenewBatchRacingCompletes(t *testing.T) {
	t.Parallel()
	mem := idem.NewMemoryStore(nil)
	idemtest.RenewBatchRacingCompletes(t, &idemtest.LeaseSetup{Store: mem, ExpireLease: func(_ context.Context, consumer, id string) error {
		if !idem.ExpireLease(mem, consumer, id) {
			return fmt.Errorf("no record %q", id)
		}
		return nil
	}})
}

package idem_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/internal/leasebatch"
)

// TestLeaseBatchStoreConformance runs the lease suite through
// leasebatch.Store over the memory store: batching concurrent calls
// changes nothing a caller can see (the concurrent cases put many calls in
// one batch).
func TestLeaseBatchStoreConformance(t *testing.T) {
	t.Parallel()
	idemtest.RunLease(t, idemtest.LeaseHarness{New: func(t *testing.T) *idemtest.LeaseSetup {
		s := newMemoryLeaseSetup(time.Now)
		s.Store = leasebatch.New(s.Store.(*idem.MemoryStore), 8)
		return s
	}})
}

// gatedBatcher records the calls that reach a memory store, and holds the
// single Acquire and Complete calls until gate closes.
type gatedBatcher struct {
	*idem.MemoryStore
	gate chan struct{}

	mu                 sync.Mutex
	singles, batches   int
	acquired, complete []int // batch sizes
}

func (g *gatedBatcher) Acquire(ctx context.Context, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	<-g.gate
	g.mu.Lock()
	g.singles++
	g.mu.Unlock()
	return g.MemoryStore.Acquire(ctx, p)
}

func (g *gatedBatcher) AcquireBatch(ctx context.Context, ps []*idemdriver.AcquireParams) ([]idemdriver.AcquireResult, []error, error) {
	g.mu.Lock()
	g.batches++
	g.acquired = append(g.acquired, len(ps))
	g.mu.Unlock()
	return g.MemoryStore.AcquireBatch(ctx, ps)
}

func (g *gatedBatcher) CompleteBatch(ctx context.Context, ps []*idemdriver.CompleteParams) ([]error, error) {
	g.mu.Lock()
	g.complete = append(g.complete, len(ps))
	g.mu.Unlock()
	return g.MemoryStore.CompleteBatch(ctx, ps)
}

// While one call is in the store, the calls that arrive wait and go in
// one batch (at most the batch size; the rest in the next), each with its
// own result; completions of many messages at once go in batches too.
func TestLeaseBatchGroupsWaitingCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &gatedBatcher{MemoryStore: idem.NewMemoryStore(nil), gate: make(chan struct{})}
		s := leasebatch.New(g, 4)
		if !s.RecordsSteps() {
			t.Error("RecordsSteps = false over the memory store, want true")
		}
		ctx := t.Context()
		acquire := func(id string) idemdriver.AcquireResult {
			res, err := s.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "c", MessageID: id, Fingerprint: []byte("fp"), Lease: time.Minute, StepPrefix: "run:"})
			if err != nil {
				t.Errorf("Acquire(%q): %v", id, err)
			}
			return res
		}
		results := make([]idemdriver.AcquireResult, 7)
		var wg sync.WaitGroup
		wg.Go(func() { results[0] = acquire("m-0") })
		synctest.Wait() // m-0 is in the store, held by the gate
		for i := 1; i < len(results); i++ {
			wg.Go(func() { results[i] = acquire(fmt.Sprintf("m-%d", i%5)) }) // m-1..m-4, then m-0 and m-1 again
		}
		synctest.Wait() // the others wait for the batch in the store
		close(g.gate)
		wg.Wait()
		if g.singles != 1 || len(g.acquired) != 2 || g.acquired[0]+g.acquired[1] != 6 || max(g.acquired[0], g.acquired[1]) != 4 {
			t.Errorf("store saw %d single Acquire calls and batches of %v; want 1 single (the first) and batches of 4 and 2", g.singles, g.acquired)
		}
		acquired := 0
		for i, r := range results {
			if r.Acquired {
				acquired++
				if r.Token != 1 {
					t.Errorf("m-%d: token %d, want 1", i%5, r.Token)
				}
			} else if r.State != idemdriver.StateInProgress {
				t.Errorf("call %d: not acquired, state %v; want in_progress (a second call for a held message)", i, r.State)
			}
		}
		if acquired != 5 {
			t.Errorf("%d calls acquired, want 5 (m-0 to m-4, once each)", acquired)
		}

		errs := make([]error, 5)
		for i := range 5 {
			wg.Go(func() {
				errs[i] = s.Complete(ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: fmt.Sprintf("m-%d", i), Token: 1, Result: []byte("r")})
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("Complete(m-%d): %v", i, err)
			}
		}
		if n := idem.CountRecords(g.MemoryStore, "c"); n != 5 {
			t.Errorf("%d records, want 5", n)
		}
		res := acquire("m-3")
		if res.Acquired || res.State != idemdriver.StateCompleted {
			t.Errorf("m-3 after the completions: acquired %v, state %v; want completed", res.Acquired, res.State)
		}
	})
}

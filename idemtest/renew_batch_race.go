package idemtest

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// RenewBatchRacingCompletes checks a store's
// idemdriver.LeaseBatchRenewer against Completes of the same records
// running at once (on SQL stores, each Complete's row lock and commit
// meeting the batch's locks and snapshot): a batch sent after a Complete
// returned never reports that lease renewed (ErrLeaseLost, or
// idemdriver.ErrRenewNotJudged while a lock was held); a record's old
// token, carried in the same batch as its new one after a takeover, is
// never renewed; and every record ends completed with its own result,
// however the batches and the Completes interleave. s.ExpireLease is
// required. It skips a store that does not renew in batches, and logs
// the batches sent and their elements' outcomes.
func RenewBatchRacingCompletes(t *testing.T, s *LeaseSetup) {
	t.Helper()
	store, ok := idemdriver.BatchRenewer(s.Store)
	if !ok {
		t.Skip("the store does not renew leases in batches (idemdriver.LeaseBatchRenewer)")
	}
	ctx := t.Context()
	const consumer, n, completers = "renew-batch-race", 60, 4
	fp, _ := idem.SHA256Fingerprint([]byte("p"))
	ps := make([]idemdriver.RenewParams, n, n+1)
	for i := range n {
		id := fmt.Sprintf("m-%02d", i)
		res, err := store.Acquire(ctx, &idemdriver.AcquireParams{Consumer: consumer, MessageID: id, Fingerprint: fp, Lease: time.Minute})
		if err != nil || !res.Acquired {
			t.Fatalf("Acquire %s: %+v %v", id, res, err)
		}
		ps[i] = idemdriver.RenewParams{Consumer: consumer, MessageID: id, Token: res.Token, Lease: time.Minute}
	}
	// m-00 taken over: its old token rides in the batch beside the new.
	if err := s.ExpireLease(ctx, consumer, "m-00"); err != nil {
		t.Fatal(err)
	}
	res, err := store.Acquire(ctx, &idemdriver.AcquireParams{Consumer: consumer, MessageID: "m-00", Fingerprint: fp, Lease: time.Minute})
	if err != nil || !res.Acquired {
		t.Fatalf("takeover of m-00: %+v %v", res, err)
	}
	old := ps[0]
	ps[0].Token = res.Token
	ps = append(ps, old) // element n: the old token
	var done [n]atomic.Bool
	var stop atomic.Bool
	var started atomic.Int64 // Completes started
	var sent atomic.Int64    // Completes started before the last batch
	var rounds, renewed, lost, unjudged atomic.Int64
	errc := make(chan error, completers+1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			var before [n]bool
			for i := range n {
				before[i] = done[i].Load()
			}
			// One batch per Complete started, sent while it runs:
			// back-to-back batches would starve the Completes on a store
			// with one writer at a time (SQLite's busy handler is not
			// fair).
			for started.Load() <= sent.Load() && !stop.Load() {
				time.Sleep(100 * time.Microsecond)
			}
			sent.Store(started.Load())
			errs, err := store.RenewBatch(ctx, ps)
			if err != nil {
				errc <- fmt.Errorf("RenewBatch: %v", err)
				return
			}
			rounds.Add(1)
			for i, e := range errs {
				switch {
				case e == nil:
					renewed.Add(1)
				case errors.Is(e, idemdriver.ErrRenewNotJudged):
					unjudged.Add(1)
				case errors.Is(e, idem.ErrLeaseLost):
					lost.Add(1)
				default:
					errc <- fmt.Errorf("element %d: %v", i, e)
					return
				}
				if i == n && e == nil {
					errc <- errors.New("the old token of m-00 renewed")
					return
				}
				if i < n && before[i] && e == nil {
					errc <- fmt.Errorf("%s renewed by a batch sent after its Complete returned", ps[i].MessageID)
					return
				}
			}
		}
	}()
	var cw sync.WaitGroup
	for w := range completers {
		cw.Add(1)
		go func() {
			defer cw.Done()
			for i := w; i < n; i += completers {
				p := ps[i]
				mine := started.Add(1)
				if err := store.Complete(ctx, &idemdriver.CompleteParams{Consumer: consumer, MessageID: p.MessageID, Token: p.Token, Result: []byte("r-" + p.MessageID)}); err != nil {
					errc <- fmt.Errorf("Complete %s: %v", p.MessageID, err)
					return
				}
				done[i].Store(true)
				// The batch of this Complete's start goes before the next.
				for sent.Load() < mine && !stop.Load() {
					time.Sleep(100 * time.Microsecond)
				}
			}
		}()
	}
	cw.Wait()
	stop.Store(true)
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	for i := range n {
		p := ps[i]
		r, err := store.Acquire(ctx, &idemdriver.AcquireParams{Consumer: consumer, MessageID: p.MessageID, Fingerprint: fp, Lease: time.Minute})
		if err != nil || r.Acquired || r.State != idemdriver.StateCompleted || string(r.Result) != "r-"+p.MessageID {
			t.Fatalf("%s at the end: %+v %v; want completed with its result", p.MessageID, r, err)
		}
	}
	t.Logf("%d batches of %d leases: %d renewed, %d lost, %d not judged", rounds.Load(), len(ps), renewed.Load(), lost.Load(), unjudged.Load())
}

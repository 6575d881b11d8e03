package idem_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// tripStore counts the lease store calls that reach the memory store: the
// single Acquire and Complete, and the batches.
type tripStore struct {
	*idem.MemoryStore
	acquire, acquireBatch, complete, completeBatch atomic.Int64
}

func (s *tripStore) Acquire(ctx context.Context, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	s.acquire.Add(1)
	return s.MemoryStore.Acquire(ctx, p)
}

func (s *tripStore) AcquireBatch(ctx context.Context, ps []*idemdriver.AcquireParams) ([]idemdriver.AcquireResult, []error, error) {
	s.acquireBatch.Add(1)
	return s.MemoryStore.AcquireBatch(ctx, ps)
}

func (s *tripStore) Complete(ctx context.Context, p *idemdriver.CompleteParams) error {
	s.complete.Add(1)
	return s.MemoryStore.Complete(ctx, p)
}

func (s *tripStore) CompleteBatch(ctx context.Context, ps []*idemdriver.CompleteParams) ([]error, error) {
	s.completeBatch.Add(1)
	return s.MemoryStore.CompleteBatch(ctx, ps)
}

// singleStore hides the memory store's batches: the lease engine falls
// back to one Acquire and one Complete per message.
type singleStore struct{ idemdriver.LeaseStore }

// TestLeaseBatchOneStoreCall: AcquireBatch of a fetched batch makes one
// store call (AcquireBatch) and CompleteBatch one more (CompleteBatch),
// each message's recovery point saved with its claim; over a store
// without batches each makes one call per message.
func TestLeaseBatchOneStoreCall(t *testing.T) {
	msgs := make([]idem.Message, 8)
	for i := range msgs {
		msgs[i] = idem.Message{ID: fmt.Sprintf("m%d", i), Payload: []byte("p")}
	}
	opt := idem.AcquireOptions{StepPrefix: "run:"}
	ctx := t.Context()
	run := func(t *testing.T, store idemdriver.LeaseStore) {
		c, err := idem.NewLeaseConsumer(store, idem.Config{Name: "c", Lease: time.Minute, PurgeInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		atts, outs, err := c.AcquireBatch(ctx, msgs, opt)
		if err != nil {
			t.Fatal(err)
		}
		results := make([]idem.Result, len(atts))
		for i, a := range atts {
			if a == nil {
				t.Fatalf("message %d not held: %v", i, outs[i].Err)
			}
			if !a.Completed(idemdriver.PrefixStep("run:", a.Token)) {
				t.Errorf("message %d: no recovery point", i)
			}
			results[i] = idem.Result{Body: []byte(a.Message.ID)}
		}
		couts, err := c.CompleteBatch(ctx, atts, results)
		if err != nil {
			t.Fatal(err)
		}
		for i, o := range couts {
			if o.Status != idem.Processed || string(o.Result) != msgs[i].ID {
				t.Errorf("message %d: %v %q, %v; want Processed %q", i, o.Status, o.Result, o.Err, msgs[i].ID)
			}
		}
		// A redelivered batch: all duplicates, no attempt.
		atts, outs, _ = c.AcquireBatch(ctx, msgs, opt)
		for i := range msgs {
			if atts[i] != nil || outs[i].Status != idem.Duplicate || string(outs[i].Result) != msgs[i].ID {
				t.Errorf("redelivered message %d: held %v, %v %q", i, atts[i] != nil, outs[i].Status, outs[i].Result)
			}
		}
	}
	t.Run("Batcher", func(t *testing.T) {
		s := &tripStore{MemoryStore: idem.NewMemoryStore(nil)}
		run(t, s)
		if a, ab, cm, cb := s.acquire.Load(), s.acquireBatch.Load(), s.complete.Load(), s.completeBatch.Load(); a != 0 || ab != 2 || cm != 0 || cb != 1 {
			t.Errorf("store calls: Acquire %d, AcquireBatch %d, Complete %d, CompleteBatch %d; want 0, 2, 0, 1", a, ab, cm, cb)
		}
	})
	t.Run("Single", func(t *testing.T) {
		s := &tripStore{MemoryStore: idem.NewMemoryStore(nil)}
		run(t, singleStore{s})
		if a, ab, cm, cb := s.acquire.Load(), s.acquireBatch.Load(), s.complete.Load(), s.completeBatch.Load(); a != 16 || ab != 0 || cm != 8 || cb != 0 {
			t.Errorf("store calls: Acquire %d, AcquireBatch %d, Complete %d, CompleteBatch %d; want 16, 0, 8, 0", a, ab, cm, cb)
		}
	})
}

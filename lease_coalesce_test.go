package idem_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/leasebatch"
)

// cancelAt is a delivery's context, cancelled d after the bubble's start
// (the delivery starts at its own at).
func cancelAt(start time.Time, d time.Duration) func() (context.Context, context.CancelFunc) {
	return func() (context.Context, context.CancelFunc) {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(time.Until(start.Add(d)), cancel)
		return ctx, cancel
	}
}

// newCoalescing returns a LeaseConsumer over s that coalesces (Config.
// Coalesce 64) with the store timeout st.
func newCoalescing(t *testing.T, s *slowBatcher, st time.Duration) *idem.LeaseConsumer {
	t.Helper()
	c, err := idem.NewLeaseConsumer(s, idem.Config{Name: "c", Lease: time.Minute, StoreTimeout: st, PurgeInterval: -1, Coalesce: 64})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestCoalesceAcquires: the Acquire calls made while one is in the store
// go in one AcquireBatch when it returns; each delivery gets its own
// outcome (a second delivery of a processed message its Duplicate), the
// handler runs once per message, every record is completed with its own
// fencing token.
func TestCoalesceAcquires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &slowBatcher{MemoryStore: idem.NewMemoryStore(nil), delays: []time.Duration{time.Second, time.Second}}
		c := newCoalescing(t, s, 10*time.Second)
		first := &delivery{id: "first"}
		again := &delivery{id: "first", at: 100 * time.Millisecond}
		ds := []*delivery{first, again, {id: "a", at: 200 * time.Millisecond}, {id: "b", at: 300 * time.Millisecond}}
		ran := map[string]int{}
		runDeliveries(c, ds, ran)
		if first.out.Status != idem.Processed || first.ended != time.Second {
			t.Errorf("first: %v, %v at %v; want processed at 1s", first.out.Status, first.err, first.ended)
		}
		if again.out.Status != idem.Duplicate || string(again.out.Result) != "ok" || again.ended != 2*time.Second {
			t.Errorf("first again: %v %q, %v at %v; want its duplicate at 2s", again.out.Status, again.out.Result, again.err, again.ended)
		}
		for _, d := range ds[2:] {
			if d.out.Status != idem.Processed || d.err != nil || d.ended != 2*time.Second || ran[d.id] != 1 {
				t.Errorf("%s: %v, %v at %v, handler ran %d; want processed at 2s (the batch), once", d.id, d.out.Status, d.err, d.ended, ran[d.id])
			}
		}
		if len(s.deadlines) != 2 || ran["first"] != 1 || idem.CountRecords(s.MemoryStore, "c") != 3 {
			t.Errorf("%d Acquire store calls, handler ran %v, %d records; want 2 (alone, then the batch), once each, 3",
				len(s.deadlines), ran, idem.CountRecords(s.MemoryStore, "c"))
		}
	})
}

// TestCoalesceRecoveryPoints: acquisitions coalesced into one batch each
// hold their own lease and fencing token, with the recovery point of
// AcquireOptions.StepPrefix saved under it, and complete under it.
func TestCoalesceRecoveryPoints(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &slowBatcher{MemoryStore: idem.NewMemoryStore(nil), delays: []time.Duration{time.Second, time.Second}}
		c := newCoalescing(t, s, 10*time.Second)
		ids := []string{"x", "y", "z"}
		atts := make([]*idem.Attempt, len(ids))
		errs := make([]error, len(ids))
		done := make(chan struct{})
		for i, id := range ids {
			go func() {
				defer func() { done <- struct{}{} }()
				atts[i], _, errs[i] = c.Acquire(context.Background(), idem.Message{ID: id, Payload: []byte("p")}, idem.AcquireOptions{StepPrefix: "run:"})
			}()
			synctest.Wait()
		}
		for range ids {
			<-done
		}
		for i, a := range atts {
			if a == nil {
				t.Fatalf("%s: not held: %v", ids[i], errs[i])
			}
			if a.Message.ID != ids[i] || a.Number != 1 || a.Token <= 0 || !a.Completed(idemdriver.PrefixStep("run:", a.Token)) {
				t.Errorf("%s: attempt %d of %q, token %d, steps %v; want its own first attempt with its recovery point", ids[i], a.Number, a.Message.ID, a.Token, a.Steps())
			}
			if out, err := a.Complete(context.Background(), idem.Result{Body: []byte(ids[i])}); out.Status != idem.Processed || err != nil {
				t.Errorf("%s: Complete: %v, %v", ids[i], out.Status, err)
			}
		}
		if len(s.deadlines) != 2 {
			t.Errorf("%d Acquire store calls; want 2 (alone, then the batch)", len(s.deadlines))
		}
	})
}

// cancelCase runs three deliveries over a store whose Acquire calls
// take delays: "first" at once, "left" at 0.1s under a context
// cancelled at leaves, "other" at 0.2s; it returns left, other, the
// handler's runs and the store.
func cancelCase(t *testing.T, delays []time.Duration, leaves time.Duration) (left, other *delivery, ran map[string]int, s *slowBatcher) {
	s = &slowBatcher{MemoryStore: idem.NewMemoryStore(nil), delays: delays}
	c := newCoalescing(t, s, 10*time.Second)
	left = &delivery{id: "left", at: 100 * time.Millisecond, ctx: cancelAt(time.Now(), leaves)}
	other = &delivery{id: "other", at: 200 * time.Millisecond}
	ran = map[string]int{}
	runDeliveries(c, []*delivery{{id: "first"}, left, other}, ran)
	return left, other, ran, s
}

// TestCoalesceQueuedCancelled: an Acquire whose context ends while it
// waits for the batch in flight fails at once with the context's error
// (Failed, ErrStore) and is never sent: no record, no store call; the
// one queued with it is processed.
func TestCoalesceQueuedCancelled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		left, other, ran, s := cancelCase(t, []time.Duration{time.Second}, 500*time.Millisecond)
		if left.out.Status != idem.Failed || !errors.Is(left.err, idem.ErrStore) || !errors.Is(left.err, context.Canceled) || left.ended != 500*time.Millisecond {
			t.Errorf("left: %v, %v at %v; want failed, ErrStore and context.Canceled at 0.5s", left.out.Status, left.err, left.ended)
		}
		if other.out.Status != idem.Processed || other.ended != time.Second {
			t.Errorf("other: %v, %v at %v; want processed at 1s", other.out.Status, other.err, other.ended)
		}
		if ran["left"] != 0 || len(s.deadlines) != 2 || idem.CountRecords(s.MemoryStore, "c") != 2 {
			t.Errorf("left's handler ran %d times, %d Acquire store calls, %d records; want 0, 2, 2", ran["left"], len(s.deadlines), idem.CountRecords(s.MemoryStore, "c"))
		}
	})
}

// TestCoalesceSentCancelled: an Acquire whose context ends while its
// batch is in the store gets the store's answer and, the message being
// acquired, releases it at once: Failed with the context's error, the
// handler not run, and the next delivery acquires the message (attempt
// 2) instead of finding it held by nobody until its lease runs out.
func TestCoalesceSentCancelled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		left, other, ran, s := cancelCase(t, []time.Duration{time.Second, time.Second}, 1500*time.Millisecond)
		if left.out.Status != idem.Failed || !errors.Is(left.err, context.Canceled) || left.ended != 2*time.Second || ran["left"] != 0 {
			t.Errorf("left: %v, %v at %v, handler ran %d; want failed with context.Canceled at 2s (the batch's answer), not run", left.out.Status, left.err, left.ended, ran["left"])
		}
		if other.out.Status != idem.Processed || other.ended != 2*time.Second {
			t.Errorf("other: %v, %v at %v; want processed at 2s", other.out.Status, other.err, other.ended)
		}
		c := newCoalescing(t, &slowBatcher{MemoryStore: s.MemoryStore}, 10*time.Second)
		a, out, err := c.Acquire(context.Background(), idem.Message{ID: "left", Payload: []byte("p")}, idem.AcquireOptions{})
		if a == nil || a.Number != 2 {
			t.Fatalf("left redelivered: %v, %v; want acquired at attempt 2 (released)", out.Status, err)
		}
		if out, err := a.Complete(context.Background(), idem.Result{}); out.Status != idem.Processed || err != nil {
			t.Fatalf("left redelivered: Complete %v, %v", out.Status, err)
		}
	})
}

// TestCoalesceBatchTimeout: a batch ends at the earliest store timeout of
// its calls (each from its own call's start): the call whose timeout it
// is fails with ErrStoreTimeout, the later one with ErrStore and
// context.DeadlineExceeded, before its own; nothing is acknowledged or
// written, and the call in flight before them is processed.
func TestCoalesceBatchTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &slowBatcher{MemoryStore: idem.NewMemoryStore(nil), delays: []time.Duration{time.Second, 5 * time.Second}}
		c := newCoalescing(t, s, 2*time.Second)
		a := &delivery{id: "a", at: 100 * time.Millisecond}
		b := &delivery{id: "b", at: 200 * time.Millisecond}
		first := &delivery{id: "first"}
		ran := map[string]int{}
		runDeliveries(c, []*delivery{first, a, b}, ran)
		if first.out.Status != idem.Processed {
			t.Errorf("first: %v, %v; want processed", first.out.Status, first.err)
		}
		if a.out.Status != idem.Failed || !errors.Is(a.err, idem.ErrStoreTimeout) || a.ended != 2100*time.Millisecond {
			t.Errorf("a: %v, %v at %v; want failed, ErrStoreTimeout, at 2.1s (its store timeout)", a.out.Status, a.err, a.ended)
		}
		if b.out.Status != idem.Failed || !errors.Is(b.err, idem.ErrStore) || !errors.Is(b.err, context.DeadlineExceeded) || b.ended != 2100*time.Millisecond {
			t.Errorf("b: %v, %v at %v; want failed, ErrStore and DeadlineExceeded, at 2.1s (the batch's deadline)", b.out.Status, b.err, b.ended)
		}
		if ran["a"]+ran["b"] != 0 || idem.CountRecords(s.MemoryStore, "c") != 1 {
			t.Errorf("handler ran %v, %d records; want only first's", ran, idem.CountRecords(s.MemoryStore, "c"))
		}
	})
}

// TestCoalesceOff: with Config.Coalesce 1 every call goes alone, at once;
// out of 0..MaxLeaseBatch Coalesce is an error matching ErrInvalidConfig.
func TestCoalesceOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &slowBatcher{MemoryStore: idem.NewMemoryStore(nil), delays: []time.Duration{time.Second, time.Second, time.Second}}
		c, err := idem.NewLeaseConsumer(s, idem.Config{Name: "c", Lease: time.Minute, PurgeInterval: -1, Coalesce: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = c.Close() }()
		ds := []*delivery{{id: "a"}, {id: "b", at: 100 * time.Millisecond}, {id: "c", at: 200 * time.Millisecond}}
		runDeliveries(c, ds, map[string]int{})
		for _, d := range ds {
			if d.out.Status != idem.Processed || d.took != time.Second {
				t.Errorf("%s: %v, %v after %v; want processed after 1s (alone)", d.id, d.out.Status, d.err, d.took)
			}
		}
		if len(s.deadlines) != 3 {
			t.Errorf("%d Acquire store calls; want 3", len(s.deadlines))
		}
	})
	for _, n := range []int{-1, 1001} {
		if _, err := idem.NewLeaseConsumer(idem.NewMemoryStore(nil), idem.Config{Name: "c", Coalesce: n}); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("Coalesce %d: %v; want ErrInvalidConfig", n, err)
		}
	}
}

// TestCoalesceNotOverSelfCoalescing: over a store that batches concurrent
// calls itself (leasebatch, idem consume's layer), the consumer sends
// each call alone, whatever Config.Coalesce, and the layer's rules hold:
// a call queued there is sent although its caller left (the consumer's
// coalescing would have answered it unsent).
func TestCoalesceNotOverSelfCoalescing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &slowBatcher{MemoryStore: idem.NewMemoryStore(nil), delays: []time.Duration{time.Second, time.Second}}
		c, err := idem.NewLeaseConsumer(leasebatch.New(s, 8), idem.Config{Name: "c", Lease: time.Minute, PurgeInterval: -1, Coalesce: 64})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = c.Close() }()
		a := &delivery{id: "a"}
		b := &delivery{id: "b", at: 100 * time.Millisecond, ctx: cancelAt(time.Now(), 500*time.Millisecond)}
		runDeliveries(c, []*delivery{a, b}, map[string]int{})
		if a.out.Status != idem.Processed || len(s.deadlines) != 2 || b.ended < time.Second {
			t.Errorf("a: %v, %v; %d Acquire store calls, b ended at %v; want a processed, 2 store calls (b's sent by leasebatch), b after 1s",
				a.out.Status, a.err, len(s.deadlines), b.ended)
		}
	})
}

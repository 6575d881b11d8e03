package idem_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemtest"
)

// TestLeaseBatchOneStoreCall: AcquireBatch of a fetched batch makes one
// store call (AcquireBatch) and CompleteBatch one more (CompleteBatch),
// each message's recovery point saved with its claim; over a store
// without batches (or recovery points in the Acquire) each makes one
// call per message, and the point one more.
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
		s := idemtest.CountBatches(idem.NewMemoryStore(nil), false)
		run(t, s)
		ab, cb := s.Batches()
		if c := s.Calls(); c.Total() != 0 || ab != 2 || cb != 1 {
			t.Errorf("store calls: %+v, AcquireBatch %d, CompleteBatch %d; want 2 AcquireBatch, 1 CompleteBatch, nothing else", c, ab, cb)
		}
	})
	t.Run("Single", func(t *testing.T) {
		// CallCounter hides the batches (and, here, the recovery
		// point's place in the Acquire).
		s := idemtest.CountCalls(idem.NewMemoryStore(nil), true)
		run(t, s)
		if c := s.Calls(); c.Acquire != 16 || c.Complete != 8 || c.SaveStep != 8 || c.Total() != 32 {
			t.Errorf("store calls: %+v; want 16 Acquire, 8 Complete, 8 SaveStep", c)
		}
	})
}

// endCounter counts the outcomes and ends the hooks see.
type endCounter struct{ outcomes, ends atomic.Int64 }

func (e *endCounter) OnOutcome(context.Context, idem.OutcomeEvent)       { e.outcomes.Add(1) }
func (e *endCounter) OnProcessEnd(context.Context, idem.ProcessEndEvent) { e.ends.Add(1) }

// TestLeaseCrashLoopEndsOnce: a message whose earlier attempts died
// without a result (over MaxAttempts) is made poison by the acquisition
// that finds it, through Acquire or AcquireBatch, and the hooks see one
// outcome and one end for that delivery, not one for the attempt's end
// and another for the acquisition's; also when the store's Release
// panics as it makes the message poison (Acquire and AcquireBatch then
// panic).
func TestLeaseCrashLoopEndsOnce(t *testing.T) {
	ctx := t.Context()
	for _, tc := range []struct{ batch, panics bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		batch := tc.batch
		t.Run(fmt.Sprintf("batch=%v/panics=%v", tc.batch, tc.panics), func(t *testing.T) {
			store := idem.NewMemoryStore(nil)
			var ls idemdriver.LeaseStore = store
			if tc.panics {
				ls = releasePanicStore{store}
			}
			h := &endCounter{}
			c, err := idem.NewLeaseConsumer(ls, idem.Config{Name: "c", Lease: time.Minute, MaxAttempts: 2, PurgeInterval: -1, Hooks: []idem.Hook{h}})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			msg := idem.Message{ID: "m", Payload: []byte("p")}
			for range 2 {
				a, _, err := c.Acquire(ctx, msg, idem.AcquireOptions{})
				if a == nil {
					t.Fatal(err)
				}
				_, _ = a.Abandon(ctx, nil)
				if !idem.ExpireLease(store, "c", "m") {
					t.Fatal("no lease to expire")
				}
			}
			h.outcomes.Store(0)
			h.ends.Store(0)
			if tc.panics {
				if r := panicOf(func() {
					if batch {
						_, _, _ = c.AcquireBatch(ctx, []idem.Message{msg}, idem.AcquireOptions{})
					} else {
						_, _, _ = c.Acquire(ctx, msg, idem.AcquireOptions{})
					}
				}); r == nil {
					t.Fatal("no panic")
				}
				if o, e := h.outcomes.Load(), h.ends.Load(); o != 1 || e != 1 {
					t.Errorf("hooks saw %d outcomes and %d ends; want 1 and 1", o, e)
				}
				return
			}
			var out idem.Outcome
			if batch {
				atts, outs, err := c.AcquireBatch(ctx, []idem.Message{msg}, idem.AcquireOptions{})
				if err != nil || atts[0] != nil {
					t.Fatalf("AcquireBatch: held %v, %v", atts[0] != nil, err)
				}
				out = outs[0]
			} else {
				var a *idem.Attempt
				a, out, _ = c.Acquire(ctx, msg, idem.AcquireOptions{})
				if a != nil {
					t.Fatal("Acquire held a crash-looping message")
				}
			}
			if out.Status != idem.Failed || !out.Poison {
				t.Fatalf("outcome %v (poison %v), %v; want a poison Failed", out.Status, out.Poison, out.Err)
			}
			if o, e := h.outcomes.Load(), h.ends.Load(); o != 1 || e != 1 {
				t.Errorf("hooks saw %d outcomes and %d ends; want 1 and 1", o, e)
			}
		})
	}
}

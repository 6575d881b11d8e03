package idem_test

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// stepPanicStore is a memory store without recovery points in its
// Acquire (so the engine saves an acquisition's point with SaveStep of
// its own), whose SaveStep panics for the message panicID; batched when
// batch is set (AcquireBatch, CompleteBatch).
type stepPanicStore struct {
	idemdriver.LeaseStore
	mem     *idem.MemoryStore
	panicID string
}

func (s *stepPanicStore) SaveStep(ctx context.Context, p *idemdriver.StepParams) error {
	if p.MessageID == s.panicID {
		panic("the store broke while saving a recovery point")
	}
	return s.LeaseStore.SaveStep(ctx, p)
}

// batchStepPanicStore is stepPanicStore with the memory store's batches.
type batchStepPanicStore struct{ *stepPanicStore }

func (s batchStepPanicStore) AcquireBatch(ctx context.Context, ps []*idemdriver.AcquireParams) ([]idemdriver.AcquireResult, []error, error) {
	return s.mem.AcquireBatch(ctx, ps)
}

func (s batchStepPanicStore) CompleteBatch(ctx context.Context, ps []*idemdriver.CompleteParams) ([]error, error) {
	return s.mem.CompleteBatch(ctx, ps)
}

// TestLeaseAcquirePanicDropsAttempt: a store that panics while an
// acquisition saves its message's recovery point (after the message was
// acquired and its attempt started) makes Acquire and AcquireBatch panic,
// and the attempt does not live on: its lease is no longer renewed, so
// that another consumer takes the message over once it runs out, and the
// hooks see one outcome and one end for each delivery, not two.
func TestLeaseAcquirePanicDropsAttempt(t *testing.T) {
	for _, mode := range []string{"Acquire", "AcquireBatch", "AcquireBatch/batcher"} {
		t.Run(mode, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx := context.Background()
				mem := idem.NewMemoryStore(nil)
				sp := &stepPanicStore{LeaseStore: mem, mem: mem, panicID: "m-1"}
				var store idemdriver.LeaseStore = sp
				if mode == "AcquireBatch/batcher" {
					store = batchStepPanicStore{sp}
				}
				h := &endCounter{}
				c, err := idem.NewLeaseConsumer(store, idem.Config{Name: "c", Lease: time.Second, PurgeInterval: -1, Hooks: []idem.Hook{h}})
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				msgs := []idem.Message{{ID: "m-0", Payload: []byte("p")}, {ID: "m-1", Payload: []byte("p")}, {ID: "m-2", Payload: []byte("p")}}
				if mode == "Acquire" {
					msgs = msgs[1:2]
				}
				opt := idem.AcquireOptions{StepPrefix: "run:"}
				panicked := panicOf(func() {
					if mode == "Acquire" {
						_, _, _ = c.Acquire(ctx, msgs[0], opt)
					} else {
						_, _, _ = c.AcquireBatch(ctx, msgs, opt)
					}
				})
				if panicked == nil {
					t.Fatal("no panic")
				}
				if o, e := h.outcomes.Load(), h.ends.Load(); o != int64(len(msgs)) || e != int64(len(msgs)) {
					t.Errorf("hooks saw %d outcomes and %d ends for %d deliveries; want one each", o, e, len(msgs))
				}
				// Past the lease: nobody renews any of them.
				time.Sleep(3 * time.Second)
				other, err := idem.NewLeaseConsumer(mem, idem.Config{Name: "c", Lease: time.Minute, PurgeInterval: -1})
				if err != nil {
					t.Fatal(err)
				}
				defer other.Close()
				for _, m := range msgs {
					a, out, err := other.Acquire(ctx, m, idem.AcquireOptions{})
					if a == nil {
						t.Errorf("%s, %v after the panic: not taken over: %v %v", m.ID, 3*time.Second, out.Status, err)
						continue
					}
					_, _ = a.Abandon(ctx, fmt.Errorf("test over"))
				}
			})
		})
	}
}

// releasePanicStore is a memory store whose Release panics.
type releasePanicStore struct{ *idem.MemoryStore }

func (releasePanicStore) Release(context.Context, *idemdriver.ReleaseParams) error {
	panic("the store broke while releasing")
}

// panicOf runs f and returns what it panicked with, nil if it did not.
func panicOf(f func()) (r any) {
	defer func() { r = recover() }()
	f()
	return nil
}

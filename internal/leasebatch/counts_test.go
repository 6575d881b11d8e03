package leasebatch

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// TestStats: calls made one after another go alone, one store call
// each; Stats reports the claims and completions and the store calls, by
// method and batch size.
func TestStats(t *testing.T) {
	s := New(idem.NewMemoryStore(nil), 64)
	ctx := context.Background()
	for i := range 3 {
		id := fmt.Sprint("m", i)
		res, err := s.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "c", MessageID: id, Fingerprint: []byte("f"), Lease: time.Minute})
		if err != nil || !res.Acquired {
			t.Fatalf("acquire %s: %+v %v", id, res, err)
		}
		if err := s.Complete(ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: id, Token: res.Token}); err != nil {
			t.Fatalf("complete %s: %v", id, err)
		}
	}
	st := s.Stats()
	if calls, trips := st.Acquire.Calls+st.Complete.Calls, st.Acquire.Trips+st.Complete.Trips; calls != 6 || trips != 6 {
		t.Fatalf("Stats() = %d calls, %d store calls; want 6, 6", calls, trips)
	}
	alone := GroupStats{Calls: 3, Trips: 3}
	alone.Batches[0], alone.CallsIn[0] = 3, 3
	if st.Acquire != alone || st.Complete != alone {
		t.Fatalf("Stats() = %+v; want each method's 3 calls alone: %+v", st, alone)
	}
}

// stallStore is a LeaseBatcher whose calls wait for their context to end
// (a store that stalls but honours its context), recording whether that
// context had a deadline.
type stallStore struct {
	*idem.MemoryStore
	deadlines chan bool
}

func (s stallStore) Acquire(ctx context.Context, _ *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	_, ok := ctx.Deadline()
	s.deadlines <- ok
	<-ctx.Done()
	return idemdriver.AcquireResult{}, ctx.Err()
}

// TestBatchKeepsTheDeadline: a batch runs on the deadline of the context
// of the call that runs it, without its cancellation: a store that
// stalls ends the call at that deadline, with the deadline's error, and
// a cancellation of the caller does not end it earlier.
func TestBatchKeepsTheDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := stallStore{MemoryStore: idem.NewMemoryStore(nil), deadlines: make(chan bool, 1)}
		s := New(st, 8)
		start := time.Now()
		ctx, cancel := context.WithDeadline(context.Background(), start.Add(3*time.Second))
		defer cancel()
		cctx, ccancel := context.WithCancel(ctx)
		time.AfterFunc(time.Second, ccancel) // the caller leaves; its call stays in the store
		_, err := s.Acquire(cctx, &idemdriver.AcquireParams{Consumer: "c", MessageID: "m", Fingerprint: []byte("f"), Lease: time.Minute})
		if !<-st.deadlines {
			t.Error("the store call had no deadline")
		}
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != 3*time.Second {
			t.Errorf("Acquire: %v after %v; want context.DeadlineExceeded after 3s", err, time.Since(start))
		}
	})
}

// TestStatsCountCallersBatches: a batch the caller made
// (idem.LeaseConsumer.AcquireBatch and CompleteBatch) goes to the store
// in one call and counts as one store call of that size.
func TestStatsCountCallersBatches(t *testing.T) {
	s := New(idem.NewMemoryStore(nil), 64)
	c, err := idem.NewLeaseConsumer(s, idem.Config{Name: "c", Lease: time.Minute, PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msgs := make([]idem.Message, 5)
	for i := range msgs {
		msgs[i] = idem.Message{ID: fmt.Sprint("m", i), Payload: []byte("p")}
	}
	atts, outs, err := c.AcquireBatch(t.Context(), msgs, idem.AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range atts {
		if a == nil {
			t.Fatalf("message %d not held: %v", i, outs[i].Err)
		}
	}
	couts, err := c.CompleteBatch(t.Context(), atts, make([]idem.Result, len(atts)))
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range couts {
		if o.Status != idem.Processed {
			t.Fatalf("message %d: %v %v", i, o.Status, o.Err)
		}
	}
	want := GroupStats{Calls: 5, Trips: 1}
	want.Batches[sizeClass(5)], want.CallsIn[sizeClass(5)] = 1, 5
	if st := s.Stats(); st.Acquire != want || st.Complete != want {
		t.Fatalf("Stats() = %+v; want one store call of 5 each: %+v", st, want)
	}
}

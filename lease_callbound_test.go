package idem_test

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/leasebatch"
)

// slowBatcher is a LeaseBatcher over the memory store whose Acquire and
// AcquireBatch calls each take the next of delays (on the clock: in a
// synctest bubble, exactly; no delay once they are used up) unless their
// context ends first: the call then returns the context's error without
// reaching the store. It records the deadline each of those calls had.
type slowBatcher struct {
	*idem.MemoryStore

	mu        sync.Mutex
	delays    []time.Duration
	deadlines []time.Time // zero: none
}

func (s *slowBatcher) wait(ctx context.Context) error {
	s.mu.Lock()
	dl, _ := ctx.Deadline()
	s.deadlines = append(s.deadlines, dl)
	var d time.Duration
	if len(s.delays) > 0 {
		d, s.delays = s.delays[0], s.delays[1:]
	}
	s.mu.Unlock()
	if d == 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *slowBatcher) Acquire(ctx context.Context, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	if err := s.wait(ctx); err != nil {
		return idemdriver.AcquireResult{}, err
	}
	return s.MemoryStore.Acquire(ctx, p)
}

func (s *slowBatcher) AcquireBatch(ctx context.Context, ps []*idemdriver.AcquireParams) ([]idemdriver.AcquireResult, []error, error) {
	if err := s.wait(ctx); err != nil {
		return nil, nil, err
	}
	return s.MemoryStore.AcquireBatch(ctx, ps)
}

// TestLeaseStoreTimeoutPastUnixNano: a StoreTimeout of math.MaxInt64 (no
// practical bound) ends past what a deadline in Unix nanoseconds holds;
// the store still sees a deadline in the future, not one wrapped into the
// past (which ended every batch of leasebatch at once, each delivery
// failing after a second), and the deliveries are processed.
func TestLeaseStoreTimeoutPastUnixNano(t *testing.T) {
	s := &slowBatcher{MemoryStore: idem.NewMemoryStore(nil)}
	c, err := idem.NewLeaseConsumer(leasebatch.New(s, 8), idem.Config{Name: "c", Lease: time.Minute,
		StoreTimeout: math.MaxInt64, PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	start := time.Now()
	msg := idem.Message{ID: "m", Payload: []byte("p")}
	ran := 0
	for _, want := range []idem.Status{idem.Processed, idem.Duplicate} {
		out, err := c.Process(context.Background(), msg, func(context.Context, *idem.Attempt) (idem.Result, error) {
			ran++
			return idem.Result{Body: []byte("ok")}, nil
		})
		if err != nil || out.Status != want {
			t.Fatalf("Process: %v, %v; want %v", out.Status, err, want)
		}
	}
	if ran != 1 {
		t.Errorf("handler ran %d times, want 1", ran)
	}
	if len(s.deadlines) != 2 {
		t.Fatalf("%d Acquire calls, want 2", len(s.deadlines))
	}
	for i, dl := range s.deadlines {
		if !dl.After(start.Add(100 * 365 * 24 * time.Hour)) {
			t.Errorf("Acquire %d: deadline %v, want one more than a century ahead", i, dl)
		}
	}
}

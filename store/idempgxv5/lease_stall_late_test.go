package idempgxv5_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/faultproxy"
	"github.com/idem-go/idem/internal/leasebatch"
)

// stallFirstComplete is the pgx store under leasebatch whose first
// Complete stalls every connection open (a fault proxy stops forwarding
// them) just before it goes out; stalled is closed then.
type stallFirstComplete struct {
	idemdriver.LeaseBatcher
	proxy   *faultproxy.Proxy
	once    sync.Once
	stalled chan struct{}
}

func (s *stallFirstComplete) Complete(ctx context.Context, p *idemdriver.CompleteParams) error {
	s.once.Do(func() {
		s.proxy.Stall()
		close(s.stalled)
	})
	return s.LeaseBatcher.Complete(ctx, p)
}

// TestLeaseBatchLateCallerStalled: idem consume's batched lease calls
// over idempgxv5 through a fault proxy, the connections stalled as the
// first message's Complete goes out (alone). The second message's
// Complete joins the batching layer at once, behind it, and the third's
// lateGap later: both go in the next batch, run by the second on its
// deadline (the store timeout from its start, about the stalled call's),
// which has passed or nearly when the stalled call ends. The first two
// fail at their store timeout with ErrStoreTimeout; the third fails with
// them, before its own store timeout, with ErrStore and
// context.DeadlineExceeded. None is acknowledged: their records stay in
// progress (read past the proxy) and their redeliveries are processed.
func TestLeaseBatchLateCallerStalled(t *testing.T) {
	t.Parallel()
	const storeTimeout, lateGap = 2 * time.Second, 1500 * time.Millisecond
	direct, proxy, store := proxiedStore(t)
	sf := &stallFirstComplete{LeaseBatcher: store, proxy: proxy, stalled: make(chan struct{})}
	lb := &enteringStore{Store: leasebatch.New(sf, 64), n: 2, all: make(chan struct{})}
	const consumer = "stall-late"
	c, err := idem.NewLeaseConsumer(lb, idem.Config{Name: consumer, Lease: time.Minute, StoreTimeout: storeTimeout,
		PurgeInterval: -1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	ctx := t.Context()

	ms := []idem.Message{{ID: "first", Payload: []byte("p")}, {ID: "runner", Payload: []byte("p")}, {ID: "late", Payload: []byte("p")}}
	var calls atomic.Int64
	var acquired sync.WaitGroup
	acquired.Add(len(ms))
	release := make(chan struct{})
	// Each handler returns once every message is held and, for the
	// second, the first's Complete stalled; for the third, the second's
	// Complete is in the batching layer too, and lateGap has passed (its
	// arrival, later than the second's).
	handler := func(_ context.Context, a *idem.Attempt) (idem.Result, error) {
		calls.Add(1)
		acquired.Done()
		<-release
		switch a.Message.ID {
		case "runner":
			<-sf.stalled
		case "late":
			<-lb.all
			time.Sleep(lateGap) // its late arrival, not a wait for another goroutine
		}
		return idem.Result{Body: []byte("r-" + a.Message.ID)}, nil
	}
	type result struct {
		out  idem.Outcome
		err  error
		done time.Time
	}
	res := make([]result, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() {
			out, err := c.Process(ctx, m, handler)
			res[i] = result{out, err, time.Now()}
		})
	}
	acquired.Wait()
	close(release)
	<-sf.stalled
	stalledAt := time.Now()
	wg.Wait()

	for i, r := range res {
		id := ms[i].ID
		took := r.done.Sub(stalledAt)
		t.Logf("%s: %v, %v after the stall: %v", id, r.out.Status, took, r.err)
		want := idem.ErrStoreTimeout
		if id == "late" {
			want = context.DeadlineExceeded
			// It entered lateGap after the stall; its own store
			// timeout would end it storeTimeout after that.
			if took >= lateGap+storeTimeout {
				t.Errorf("late: failed %v after the stall, want before its own store timeout (%v)", took, lateGap+storeTimeout)
			}
		}
		if r.out.Status != idem.Failed || !errors.Is(r.err, idem.ErrStore) || !errors.Is(r.err, want) {
			t.Errorf("%s: %v, %v; want failed, ErrStore and %v", id, r.out.Status, r.err, want)
		}
	}
	redeliverAfterStall(t, c, direct, proxy, consumer, ms, ms, &calls)
}

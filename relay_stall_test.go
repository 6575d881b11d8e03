package idem_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// stallingOutbox is a fakeOutbox whose next stalls claims never answer,
// as on a connection to the store that went into a black hole mid-call:
// nothing comes back and nothing is closed.
type stallingOutbox struct {
	*fakeOutbox
	stalls atomic.Int32
}

func (s *stallingOutbox) ClaimOutgoing(ctx context.Context, p *idemdriver.ClaimOutgoingParams) ([]idemdriver.OutgoingRecord, error) {
	if s.stalls.Add(-1) >= 0 {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return s.fakeOutbox.ClaimOutgoing(ctx, p)
}

// TestRelayClaimStalled: a claim that never answers is given up after
// 10s, whatever the relay's lease, with an error matching ErrStore and
// ErrStoreTimeout, and Run goes on sending. The fault soak found it: a PostgreSQL connection
// stalled mid-claim held every relay worker for good, and the outbox
// stopped.
func TestRelayClaimStalled(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newFake("a", "b")
		store := &stallingOutbox{fakeOutbox: f}
		store.stalls.Store(1)
		r, err := idem.NewRelay(idem.RelayConfig{Store: store, Retention: -1,
			Publisher: idem.PublisherFunc(func(_ context.Context, msgs []idem.Outgoing) []error { return make([]error, len(msgs)) })})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if _, err := r.RunOnce(t.Context()); !errors.Is(err, idem.ErrStore) || !errors.Is(err, idem.ErrStoreTimeout) {
			t.Errorf("RunOnce on a stalled claim = %v, want ErrStore and ErrStoreTimeout", err)
		}
		if d := time.Since(start); d != 10*time.Second {
			t.Errorf("the stalled claim was given up after %v, want 10s", d)
		}

		store.stalls.Store(2) // both workers' first claims stall
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- r.Run(ctx) }()
		time.Sleep(time.Minute)
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if !f.sent["a"] || !f.sent["b"] {
			t.Errorf("sent %v a minute after two stalled claims, want a and b", f.sent)
		}
	})
}

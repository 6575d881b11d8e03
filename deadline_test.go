package idem_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// stallingStore is a MemoryStore whose lease-mode and purge calls named in
// stall block until their context ends, as on a connection that stopped
// answering. (The transactional calls are covered by idemtest's Deadline
// cases, run on every store.)
type stallingStore struct {
	*idem.MemoryStore
	stall map[string]*atomic.Bool
}

func newStallingStore() *stallingStore {
	s := &stallingStore{MemoryStore: idem.NewMemoryStore(nil), stall: map[string]*atomic.Bool{}}
	for _, op := range []string{"acquire", "renew", "complete", "purge-lock", "purge-batch"} {
		s.stall[op] = &atomic.Bool{}
	}
	return s
}

// wait blocks until ctx ends when op stalls.
func (s *stallingStore) wait(ctx context.Context, op string) error {
	if !s.stall[op].Load() {
		return nil
	}
	<-ctx.Done()
	return ctx.Err()
}

func (s *stallingStore) Acquire(ctx context.Context, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	if err := s.wait(ctx, "acquire"); err != nil {
		return idemdriver.AcquireResult{}, err
	}
	return s.MemoryStore.Acquire(ctx, p)
}

func (s *stallingStore) Renew(ctx context.Context, p *idemdriver.RenewParams) error {
	if err := s.wait(ctx, "renew"); err != nil {
		return err
	}
	return s.MemoryStore.Renew(ctx, p)
}

// RenewsBatches is false: the scheduler sends its renewals one by one,
// through Renew above, not through the memory store's RenewBatch.
func (s *stallingStore) RenewsBatches() bool { return false }

func (s *stallingStore) Complete(ctx context.Context, p *idemdriver.CompleteParams) error {
	if err := s.wait(ctx, "complete"); err != nil {
		return err
	}
	return s.MemoryStore.Complete(ctx, p)
}

func (s *stallingStore) BeginPurge(ctx context.Context, p *idemdriver.BeginPurgeParams) (idemdriver.PurgeSession, error) {
	if err := s.wait(ctx, "purge-lock"); err != nil {
		return nil, err
	}
	ps, err := s.MemoryStore.BeginPurge(ctx, p)
	if err != nil {
		return nil, err
	}
	return &stallingSession{PurgeSession: ps, s: s}, nil
}

type stallingSession struct {
	idemdriver.PurgeSession
	s *stallingStore
}

func (ss *stallingSession) DeleteBatch(ctx context.Context, p *idemdriver.PurgeBatchParams) (int64, error) {
	if err := ss.s.wait(ctx, "purge-batch"); err != nil {
		return 0, err
	}
	return ss.PurgeSession.DeleteBatch(ctx, p)
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// In lease mode, StoreTimeout bounds the acquire, each renewal and the
// final write: a stalled Acquire fails the delivery after StoreTimeout
// (Failed, ErrStore and ErrStoreTimeout), a stalled Complete abandons the
// attempt after StoreTimeout, and the next attempt takes over once the
// lease runs out. Time is synctest's, so the bounds are exact. The same
// holds for a caller whose context cannot be cancelled, whose calls share
// one context bounded by the renewal scheduler instead of a timer each.
func TestLeaseStoreTimeout(t *testing.T) {
	t.Parallel()
	t.Run("cancellable", func(t *testing.T) { testLeaseStoreTimeout(t, false) })
	t.Run("background", func(t *testing.T) { testLeaseStoreTimeout(t, true) })
}

func testLeaseStoreTimeout(t *testing.T, background bool) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		if background {
			ctx = context.Background()
		}
		const storeTimeout = 2 * time.Second
		store := newStallingStore()
		c, err := idem.NewLeaseConsumer(store, idem.Config{Name: "c", StoreTimeout: storeTimeout, Lease: 6 * time.Second, PurgeInterval: -1, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		msg := idem.Message{ID: "m-1", Payload: []byte("p")}
		var runs atomic.Int64
		h := func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
			runs.Add(1)
			return idem.Result{Body: []byte("done")}, nil
		}

		store.stall["acquire"].Store(true)
		start := time.Now()
		out, err := c.Process(ctx, msg, h)
		if took := time.Since(start); took != storeTimeout {
			t.Errorf("stalled acquire returned after %v, want StoreTimeout %v", took, storeTimeout)
		}
		if out.Status != idem.Failed || !errors.Is(err, idem.ErrStore) || !errors.Is(err, idem.ErrStoreTimeout) || out.Ack() {
			t.Errorf("stalled acquire: %v, %v; want Failed matching ErrStore and ErrStoreTimeout", out.Status, err)
		}
		store.stall["acquire"].Store(false)

		store.stall["complete"].Store(true)
		start = time.Now()
		out, err = c.Process(ctx, msg, h)
		if took := time.Since(start); took != storeTimeout {
			t.Errorf("stalled complete returned after %v, want StoreTimeout %v", took, storeTimeout)
		}
		if out.Status != idem.Failed || !errors.Is(err, idem.ErrStoreTimeout) || out.Ack() {
			t.Errorf("stalled complete: %v, %v; want Failed matching ErrStoreTimeout", out.Status, err)
		}
		store.stall["complete"].Store(false)

		// The abandoned attempt's lease runs out; the next takes over.
		time.Sleep(6 * time.Second)
		out, err = c.Process(ctx, msg, h)
		if out.Status != idem.Processed || err != nil || out.Attempt != 2 {
			t.Errorf("after the lease ran out: %v (attempt %d), %v; want Processed by attempt 2", out.Status, out.Attempt, err)
		}
		if runs.Load() != 2 {
			t.Errorf("handler ran %d times, want 2 (the stalled completion's attempt, then the takeover)", runs.Load())
		}
	})
}

// A renewal that stalls is cut at StoreTimeout and the next one, a
// Lease/3 later, keeps the lease: the handler, which runs for two leases,
// is not cancelled and completes.
func TestLeaseRenewalStoreTimeout(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const lease = 6 * time.Second
		store := newStallingStore()
		c, err := idem.NewLeaseConsumer(store, idem.Config{Name: "c", StoreTimeout: time.Second, Lease: lease, PurgeInterval: -1, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		h := func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
			store.stall["renew"].Store(true) // the first renewal, at Lease/3, stalls
			time.Sleep(lease/3 + lease/6)
			store.stall["renew"].Store(false)
			select {
			case <-time.After(2 * lease):
				return idem.Result{}, nil
			case <-ctx.Done():
				return idem.Result{}, context.Cause(ctx)
			}
		}
		out, err := c.Process(t.Context(), idem.Message{ID: "m-1", Payload: []byte("p")}, h)
		if out.Status != idem.Processed || err != nil {
			t.Errorf("handler across a stalled renewal: %v, %v; want Processed", out.Status, err)
		}
	})
}

// A purge whose batch stalls stops after PurgeParams.StoreTimeout with an
// error matching ErrStore and ErrStoreTimeout, and releases its lock: the
// next purge runs.
func TestPurgeStoreTimeout(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		store := newStallingStore()
		c, err := idem.NewConsumer(store, idem.Config{Name: "c", PurgeInterval: -1, RetentionWindow: time.Hour, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Process(t.Context(), idem.Message{ID: "old"}, func(context.Context, *idem.MemoryTx, idem.Message) error { return nil }); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Hour) // the consumer runs past the window
		p := idem.PurgeParams{Consumer: "c", RetentionWindow: time.Hour, BatchSize: 10, StoreTimeout: 3 * time.Second}
		store.stall["purge-batch"].Store(true)
		start := time.Now()
		_, err = idem.Purge(t.Context(), store, p)
		if took := time.Since(start); took != p.StoreTimeout {
			t.Errorf("stalled purge returned after %v, want %v", took, p.StoreTimeout)
		}
		if !errors.Is(err, idem.ErrStore) || !errors.Is(err, idem.ErrStoreTimeout) {
			t.Errorf("stalled purge: %v, want an error matching ErrStore and ErrStoreTimeout", err)
		}
		store.stall["purge-batch"].Store(false)
		res, err := idem.Purge(t.Context(), store, p)
		if err != nil || res.Deleted != 1 {
			t.Errorf("purge after the stall: %+v, %v; want 1 deleted", res, err)
		}
	})
}

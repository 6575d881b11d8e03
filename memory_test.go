package idem_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/internal/leakcheck"
)

func TestMain(m *testing.M) { os.Exit(leakcheck.Run(m)) }

// fakeClock is the memory store's injected clock: it starts at the real
// time (so purge horizons are comparable with time.Now) and moves forward
// one microsecond per reading, so record times are distinct and ordered.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Now()} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(time.Microsecond)
	return c.now
}

// effects is the memory Setup's side-effect table.
type effects struct {
	mu   sync.Mutex
	rows map[string]int
}

func (e *effects) add(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.rows[key]++
}

func (e *effects) count(key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.rows[key]
}

func newMemorySetup(t *testing.T) (*idem.MemoryStore, *idemtest.Setup[*idem.MemoryTx]) {
	return newMemorySetupOn(idem.NewMemoryStore(newFakeClock().Now))
}

func newMemorySetupOn(store *idem.MemoryStore) (*idem.MemoryStore, *idemtest.Setup[*idem.MemoryTx]) {
	eff := &effects{rows: map[string]int{}}
	return store, &idemtest.Setup[*idem.MemoryTx]{
		Store: store,
		WriteEffect: func(ctx context.Context, tx *idem.MemoryTx, key string) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			tx.OnCommit(func() { eff.add(key) })
			return nil
		},
		CountEffects: func(_ context.Context, key string) (int, error) { return eff.count(key), nil },
		CountRecords: func(_ context.Context, consumer string) (int, error) { return idem.CountRecords(store, consumer), nil },
		Shift: func(_ context.Context, consumer string, d time.Duration) error {
			idem.Shift(store, consumer, d)
			return nil
		},
	}
}

func TestMemoryStoreConformance(t *testing.T) {
	t.Parallel()
	idemtest.Run(t, idemtest.Harness[*idem.MemoryTx]{New: func(t *testing.T) *idemtest.Setup[*idem.MemoryTx] {
		_, s := newMemorySetup(t)
		return s
	}})
}

// beginClaimStore gives the memory store the optional BeginClaimer
// capability, so the suite also covers the Consumer's BeginClaim path. A
// duplicate ends its transaction in the store (ClaimResult.Ended), as
// idempgxv5's BeginClaim does.
type beginClaimStore struct{ *idem.MemoryStore }

func (s beginClaimStore) BeginClaim(ctx context.Context, p *idemdriver.ClaimParams) (*idem.MemoryTx, idemdriver.ClaimResult, error) {
	tx, err := s.Begin(ctx)
	if err != nil {
		return nil, idemdriver.ClaimResult{}, err
	}
	res, err := s.ClaimTx(ctx, tx, p)
	if err != nil || !res.Claimed {
		rerr := s.Rollback(context.WithoutCancel(ctx), tx)
		if err = errors.Join(err, rerr); err != nil {
			return nil, idemdriver.ClaimResult{}, err
		}
		res.Ended = true
		return nil, res, nil
	}
	return tx, res, nil
}

func TestMemoryStoreWithBeginClaimConformance(t *testing.T) {
	t.Parallel()
	idemtest.Run(t, idemtest.Harness[*idem.MemoryTx]{New: func(t *testing.T) *idemtest.Setup[*idem.MemoryTx] {
		store, s := newMemorySetup(t)
		s.Store = beginClaimStore{store}
		return s
	}})
}

// newMemoryLeaseSetup is a LeaseSetup over a fresh memory store with the
// clock now; ExpireLease uses the store's test hook.
func newMemoryLeaseSetup(now func() time.Time) *idemtest.LeaseSetup {
	store := idem.NewMemoryStore(now)
	return &idemtest.LeaseSetup{
		Store: store,
		ExpireLease: func(_ context.Context, consumer, id string) error {
			if !idem.ExpireLease(store, consumer, id) {
				return fmt.Errorf("no in_progress record %q of consumer %q", id, consumer)
			}
			return nil
		},
		CountRecords: func(_ context.Context, consumer string) (int, error) { return idem.CountRecords(store, consumer), nil },
		Shift: func(_ context.Context, consumer string, d time.Duration) error {
			idem.Shift(store, consumer, d)
			return nil
		},
	}
}

// TestMemoryStoreLeaseConformance runs the lease suite twice: on the fake
// clock, where leases end only when a case ends them (fully
// deterministic), and on the real clock, where leases also run out by
// themselves, as they do on the database and Redis stores.
func TestMemoryStoreLeaseConformance(t *testing.T) {
	t.Parallel()
	t.Run("FakeClock", func(t *testing.T) {
		t.Parallel()
		idemtest.RunLease(t, idemtest.LeaseHarness{New: func(t *testing.T) *idemtest.LeaseSetup {
			return newMemoryLeaseSetup(newFakeClock().Now)
		}})
	})
	t.Run("RealClock", func(t *testing.T) {
		t.Parallel()
		idemtest.RunLease(t, idemtest.LeaseHarness{New: func(t *testing.T) *idemtest.LeaseSetup {
			return newMemoryLeaseSetup(time.Now)
		}})
	})
}

// txOnlyStore hides the memory store's optional capabilities (the
// one-statement batch claim), so the suite covers the Consumer's fallback
// of one ClaimTx per message.
type txOnlyStore struct{ s *idem.MemoryStore }

func (t txOnlyStore) Begin(ctx context.Context) (*idem.MemoryTx, error) { return t.s.Begin(ctx) }
func (t txOnlyStore) ClaimTx(ctx context.Context, tx *idem.MemoryTx, p *idemdriver.ClaimParams) (idemdriver.ClaimResult, error) {
	return t.s.ClaimTx(ctx, tx, p)
}
func (t txOnlyStore) Commit(ctx context.Context, tx *idem.MemoryTx) error { return t.s.Commit(ctx, tx) }
func (t txOnlyStore) Rollback(ctx context.Context, tx *idem.MemoryTx) error {
	return t.s.Rollback(ctx, tx)
}
func (t txOnlyStore) MarkRunning(ctx context.Context, p *idemdriver.MarkRunningParams) error {
	return t.s.MarkRunning(ctx, p)
}
func (t txOnlyStore) BeginPurge(ctx context.Context, p *idemdriver.BeginPurgeParams) (idemdriver.PurgeSession, error) {
	return t.s.BeginPurge(ctx, p)
}

func TestMemoryStoreWithoutBatchClaimConformance(t *testing.T) {
	t.Parallel()
	idemtest.Run(t, idemtest.Harness[*idem.MemoryTx]{New: func(t *testing.T) *idemtest.Setup[*idem.MemoryTx] {
		store, s := newMemorySetup(t)
		s.Store = txOnlyStore{store}
		return s
	}})
}

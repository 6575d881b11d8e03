package idem_test

import (
	"context"
	"errors"
	"github.com/idem-go/idem/idemdriver"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
)

// renewHook decorates the memory store's Renew.
type renewHook struct {
	*idem.MemoryStore
	renew func(ctx context.Context, p *idemdriver.RenewParams) error
}

func (s *renewHook) Renew(ctx context.Context, p *idemdriver.RenewParams) error {
	return s.renew(ctx, p)
}

// RenewsBatches is false: the scheduler sends its renewals one by one,
// through Renew above, not through the memory store's RenewBatch.
func (s *renewHook) RenewsBatches() bool { return false }

func newLeaseConsumer(t *testing.T, store idemdriver.LeaseStore, lease time.Duration) *idem.LeaseConsumer {
	t.Helper()
	c, err := idem.NewLeaseConsumer(store, idem.Config{Name: "c", Lease: lease, PurgeInterval: -1})
	if err != nil {
		t.Fatalf("NewLeaseConsumer: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// A handler still running after the caller's context ended (finishing an
// external call it must not abandon) keeps its lease: the renewals go on
// until it returns, so no other attempt takes over meanwhile, and its
// result is stored. In a synctest bubble: a loaded machine cannot let the
// 150ms lease run out between two renewals.
func TestLeaseConsumerRenewsAfterCallerCancel(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		store := idem.NewMemoryStore(nil)
		var renewals atomic.Int64
		renewed := make(chan struct{}, 100)
		hook := &renewHook{MemoryStore: store}
		hook.renew = func(ctx context.Context, p *idemdriver.RenewParams) error {
			err := store.Renew(ctx, p)
			if err == nil {
				renewals.Add(1)
				select {
				case renewed <- struct{}{}:
				default:
				}
			}
			return err
		}
		c := newLeaseConsumer(t, hook, 150*time.Millisecond)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		msg := idem.Message{ID: "m-1", Payload: []byte("p")}
		out, err := c.Process(ctx, msg, func(hctx context.Context, a *idem.Attempt) (idem.Result, error) {
			cancel()
			<-hctx.Done()
			before := renewals.Load()
			timeout := time.After(10 * time.Second)
			for renewals.Load() < before+2 {
				select {
				case <-renewed:
				case <-timeout:
					t.Errorf("renewals after the caller's context ended: %d in 10s, want at least 2", renewals.Load()-before)
					return idem.Result{}, errors.New("not renewed")
				}
			}
			return idem.Result{Body: []byte("finished")}, nil
		})
		if out.Status != idem.Processed || err != nil {
			t.Errorf("Process whose caller gave up while the handler finished: %v, %v; want Processed and nil", out.Status, err)
		}
	})
}

// A renewal call that hangs (a dead connection) is cancelled when the
// handler returns: Process does not wait for it. In a synctest bubble,
// so the 10s bound is the bubble's, not a loaded machine's.
func TestLeaseConsumerHungRenewalDoesNotBlock(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		store := idem.NewMemoryStore(nil)
		inRenew := make(chan struct{})
		var once atomic.Bool
		hook := &renewHook{MemoryStore: store}
		hook.renew = func(ctx context.Context, p *idemdriver.RenewParams) error {
			if once.CompareAndSwap(false, true) {
				close(inRenew)
			}
			<-ctx.Done() // hangs until cancelled
			return ctx.Err()
		}
		c := newLeaseConsumer(t, hook, idem.MinLease)
		msg := idem.Message{ID: "m-1", Payload: []byte("p")}
		done := make(chan idem.Outcome, 1)
		go func() {
			out, _ := c.Process(t.Context(), msg, func(context.Context, *idem.Attempt) (idem.Result, error) {
				<-inRenew
				return idem.Result{Body: []byte("ok")}, nil
			})
			done <- out
		}()
		select {
		case out := <-done:
			if out.Status != idem.Processed {
				t.Errorf("Process with a hung renewal: %v (%v), want Processed", out.Status, out.Err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Process did not return within 10s of its handler: it waits for a hung renewal")
		}
	})
}

// When renewals keep failing (the store is unreachable), the handler is
// cancelled with cause ErrLeaseLost once the lease has run out by the
// consumer's own clock, before another attempt could take over beside it.
func TestLeaseConsumerCancelsWhenRenewalsFail(t *testing.T) {
	t.Parallel()
	store := idem.NewMemoryStore(nil)
	hook := &renewHook{MemoryStore: store}
	hook.renew = func(ctx context.Context, p *idemdriver.RenewParams) error { return errors.New("connection refused") }
	c := newLeaseConsumer(t, hook, idem.MinLease)
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}
	start := time.Now()
	out, err := c.Process(t.Context(), msg, func(hctx context.Context, a *idem.Attempt) (idem.Result, error) {
		select {
		case <-hctx.Done():
			return idem.Result{}, context.Cause(hctx)
		case <-time.After(10 * time.Second):
			return idem.Result{}, errors.New("handler never cancelled")
		}
	})
	if out.Status != idem.Failed || !errors.Is(err, idem.ErrLeaseLost) {
		t.Errorf("Process with failing renewals: %v, %v; want Failed with ErrLeaseLost", out.Status, err)
	}
	if d := time.Since(start); d < idem.MinLease {
		t.Errorf("handler cancelled after %v, before the lease (%v) ran out", d, idem.MinLease)
	}
}

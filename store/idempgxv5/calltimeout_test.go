package idempgxv5_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/faultproxy"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestCallTimeoutWithoutCancellableContext: the Store bounds the calls of
// a transaction BeginClaim began by itself (idemdriver.CallTimer), so a
// delivery under a context that can never be cancelled still fails after
// StoreTimeout with an error matching ErrStoreTimeout when its connection
// stalls in the claim, the commit or the outbox's emit-and-commit, or when
// no connection comes free; nothing is recorded, and a handler slower than
// StoreTimeout still commits (the deadline is off while it runs).
func TestCallTimeoutWithoutCancellableContext(t *testing.T) {
	t.Parallel()
	const storeTimeout = time.Second
	direct := setup(t, poolOpts{})
	if !direct.store.TimesCalls() {
		t.Fatal("TimesCalls() = false on the default layout")
	}
	var _ idemdriver.CallTimer = direct.store

	type stallAt int
	const (
		inClaim stallAt = iota
		inCommit
		inEmitCommit
		poolBusy
		slowHandler
	)
	for _, tc := range []struct {
		name string
		at   stallAt
	}{{"claim", inClaim}, {"commit", inCommit}, {"emit-commit", inEmitCommit}, {"pool-busy", poolBusy}, {"slow-handler", slowHandler}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			proxy, url := faultproxy.URL(t, testURL(t))
			cfg, err := pgxpool.ParseConfig(url)
			if err != nil {
				t.Fatal(err)
			}
			cfg.MaxConns = 1
			pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				proxy.Close()
				pool.Close()
			})
			store, err := idempgxv5.New(pool, &idempgxv5.Config{Table: direct.table})
			if err != nil {
				t.Fatal(err)
			}
			name := "ct-" + tc.name
			c, err := idem.NewConsumer(store, idem.Config{Name: name, StoreTimeout: storeTimeout, PurgeInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			ctx := context.Background() // never cancelled: only the Store bounds the calls
			handler := func(ctx context.Context, tx pgx.Tx, msg idem.Message) error {
				if err := direct.writeEffect(ctx, tx, msg.ID); err != nil {
					return err
				}
				switch tc.at {
				case inCommit:
					proxy.Stall()
				case inEmitCommit:
					if _, err := idem.Emit(ctx, idem.OutgoingMessage{Destination: "d", Payload: msg.Payload}); err != nil {
						return err
					}
					proxy.Stall()
				case slowHandler:
					time.Sleep(2 * storeTimeout) // the handler's own work, not a store call
				}
				return nil
			}
			// A first message opens the pool's connection through the proxy.
			warm := idem.Message{ID: tc.name + "-warm", Payload: []byte("p")}
			if out, err := c.Process(ctx, warm, direct.effectHandler()); err != nil || out.Status != idem.Processed {
				t.Fatalf("first message: %v, %v", out.Status, err)
			}
			switch tc.at {
			case inClaim:
				proxy.Stall()
			case poolBusy:
				held, err := pool.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer held.Release()
			}
			msg := idem.Message{ID: tc.name, Payload: []byte("p")}
			start := time.Now()
			out, err := c.Process(ctx, msg, handler)
			took := time.Since(start)
			if tc.at == slowHandler {
				if err != nil || out.Status != idem.Processed {
					t.Fatalf("handler slower than StoreTimeout: %v, %v; want Processed", out.Status, err)
				}
				if n := direct.countEffects(t, msg.ID); n != 1 {
					t.Errorf("effects of %q: %d, want 1", msg.ID, n)
				}
				return
			}
			if out.Status != idem.Failed || !errors.Is(err, idem.ErrStoreTimeout) || !errors.Is(err, idem.ErrStore) || idem.IsPermanent(err) {
				t.Fatalf("delivery whose store call stalls: %v, %v; want Failed, a retryable error matching ErrStore and ErrStoreTimeout", out.Status, err)
			}
			if took < storeTimeout || took > 20*storeTimeout {
				t.Errorf("delivery whose store call stalls returned after %v, want about StoreTimeout (%v)", took, storeTimeout)
			}
			if n := direct.countEffects(t, msg.ID); n != 0 {
				t.Errorf("effects of %q after the stall: %d, want 0", msg.ID, n)
			}
			if n := direct.countRecords(t, name); n != 1 {
				t.Errorf("records of %s after the stall: %d, want 1 (the first message's)", name, n)
			}
		})
	}
}

package idempgxv5_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/faultproxy"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// idleConnsTakeLongCalls fails t unless every idle connection of pool runs
// a statement longer than d: a connection given back to the pool with a
// call's deadline still set would fail it.
func idleConnsTakeLongCalls(t *testing.T, pool *pgxpool.Pool, d time.Duration) {
	t.Helper()
	ctx := context.Background()
	idle := pool.AcquireAllIdle(ctx)
	if len(idle) == 0 {
		t.Errorf("no idle connection to check")
	}
	for _, c := range idle {
		if _, err := c.Exec(ctx, `SELECT pg_sleep($1)`, (d + d/2).Seconds()); err != nil {
			t.Errorf("a statement of %v on an idle connection: %v (a deadline left set?)", d+d/2, err)
		}
		c.Release()
	}
}

// TestBreakCallTimerPgBouncer runs the Store's own call deadlines
// (idemdriver.CallTimer) through PgBouncer in transaction pooling, in
// each query exec mode it supports, with a fault proxy between the pool
// and PgBouncer:
//
//   - handlers that run their own statement for twice StoreTimeout inside
//     the claim's transaction are not cut (the deadline is off while the
//     handler runs);
//   - mid-load every answer turns slower than StoreTimeout for a few
//     seconds (a COMMIT applied whose answer comes late, claims and new
//     connections that do not answer in time): the calls caught fail
//     with ErrStoreTimeout, their redeliveries are duplicates or run
//     again, and every message has its effect once, counted in the
//     database; then no connection is left acquired, and each idle one
//     runs a statement longer than StoreTimeout (no deadline left set).
func TestBreakCallTimerPgBouncer(t *testing.T) {
	bouncerURL(t)
	for _, mode := range bouncerModes {
		t.Run(modeName(mode), func(t *testing.T) {
			t.Parallel()
			const (
				storeTimeout = 500 * time.Millisecond
				messages     = 200
				workers      = 4
			)
			direct := setup(t, poolOpts{})
			proxy, url := faultproxy.URL(t, bouncerURL(t))
			pool := newPool(t, poolOpts{maxConns: workers + 1, mode: mode, url: url})
			t.Cleanup(proxy.Close)
			store, err := idempgxv5.New(pool, &idempgxv5.Config{Table: direct.table})
			if err != nil {
				t.Fatal(err)
			}
			if !store.TimesCalls() {
				t.Fatal("TimesCalls() = false")
			}
			c, err := idem.NewConsumer(store, idem.Config{Name: "bouncer", StoreTimeout: storeTimeout, PurgeInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })

			// Handlers slower than StoreTimeout, in their own statements.
			slow := func(ctx context.Context, tx pgx.Tx, msg idem.Message) error {
				if _, err := tx.Exec(ctx, `SELECT pg_sleep($1)`, (2 * storeTimeout).Seconds()); err != nil {
					return err
				}
				return direct.writeEffect(ctx, tx, msg.ID)
			}
			for _, id := range []string{"slow-1", "slow-2"} {
				if out, err := c.Process(context.Background(), idem.Message{ID: id, Payload: []byte("p")}, slow); out.Status != idem.Processed {
					t.Fatalf("%s, a handler of %v: %v, %v; want processed (the handler is not bounded by StoreTimeout)", id, 2*storeTimeout, out.Status, err)
				}
			}

			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			var slowing atomic.Bool
			rep := faultproxy.Deliver(ctx, t, faultproxy.Delivery[pgx.Tx]{
				Consumer: c, Messages: messages, Workers: workers, FaultAt: messages / 3,
				// From the fault on, every answer comes 3 x StoreTimeout
				// late, until 2s after the faulted handler's own effect
				// (unbounded) returned: its COMMIT's answer is late.
				Fault: func() { slowing.Store(true); proxy.Slow(3 * storeTimeout) },
				Effect: func(ctx context.Context, tx pgx.Tx, id string) error {
					err := direct.writeEffect(ctx, tx, id)
					if slowing.CompareAndSwap(true, false) {
						time.AfterFunc(2*time.Second, func() { proxy.Slow(0) })
					}
					return err
				},
			})
			t.Logf("PgBouncer (%s) behind a proxy %v slower, from the fault to 2s after the faulted handler: %v", modeName(mode), 3*storeTimeout, rep)
			if rep.TimedOut == 0 {
				t.Errorf("no delivery timed out: the fault missed (%v)", rep)
			}
			var rows, distinct int
			if err := direct.pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT key) FROM `+direct.effects+` WHERE key LIKE 'm-%'`).Scan(&rows, &distinct); err != nil {
				t.Fatal(err)
			}
			if records := direct.countRecords(t, "bouncer"); rows != messages || distinct != messages || records != messages+2 {
				t.Errorf("effects: %d rows, %d distinct; records %d; want %d effects (0 double, 0 lost) and %d records", rows, distinct, records, messages, messages+2)
			}
			checkPool(t, pool)
			idleConnsTakeLongCalls(t, pool, storeTimeout)
		})
	}
}

// TestBreakCallTimerCallerCancels cancels the caller's context at each
// step of a transactional delivery whose calls the Store bounds itself
// (StoreTimeout far away): before Process, while the handler's statement
// runs, after the handler's effect and before the commit, and while the
// commit's answer is held back by a slow network. No delivery is
// acknowledged; each message's redelivery under a live context is then
// processed or a duplicate, and has one effect and one record, counted in
// the database. The pool (two connections) has none left acquired, and
// its idle connections run statements longer than a call's bound.
func TestBreakCallTimerCallerCancels(t *testing.T) {
	t.Parallel()
	const storeTimeout = 2 * time.Second
	direct := setup(t, poolOpts{})
	proxy, url := faultproxy.URL(t, testURL(t))
	pool := newPool(t, poolOpts{maxConns: 2, url: url})
	t.Cleanup(proxy.Close)
	store, err := idempgxv5.New(pool, &idempgxv5.Config{Table: direct.table})
	if err != nil {
		t.Fatal(err)
	}
	c, err := idem.NewConsumer(store, idem.Config{Name: "cancel", StoreTimeout: storeTimeout, PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })

	for _, tc := range []struct {
		name    string
		handler func(cancel context.CancelFunc) idem.Handler[pgx.Tx]
		before  bool // cancel before Process
	}{
		{name: "before-process", before: true, handler: func(context.CancelFunc) idem.Handler[pgx.Tx] { return direct.effectHandler() }},
		{name: "in-handler-statement", handler: func(cancel context.CancelFunc) idem.Handler[pgx.Tx] {
			return func(ctx context.Context, tx pgx.Tx, msg idem.Message) error {
				if err := direct.writeEffect(ctx, tx, msg.ID); err != nil {
					return err
				}
				time.AfterFunc(50*time.Millisecond, cancel)
				_, err := tx.Exec(ctx, `SELECT pg_sleep(30)`)
				return err
			}
		}},
		{name: "before-commit", handler: func(cancel context.CancelFunc) idem.Handler[pgx.Tx] {
			return func(ctx context.Context, tx pgx.Tx, msg idem.Message) error {
				err := direct.writeEffect(ctx, tx, msg.ID)
				cancel()
				return err
			}
		}},
		{name: "in-commit", handler: func(cancel context.CancelFunc) idem.Handler[pgx.Tx] {
			return func(ctx context.Context, tx pgx.Tx, msg idem.Message) error {
				if err := direct.writeEffect(ctx, tx, msg.ID); err != nil {
					return err
				}
				proxy.Slow(storeTimeout / 2) // the COMMIT's answer held back
				time.AfterFunc(storeTimeout/4, cancel)
				return nil
			}
		}},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		if tc.before {
			cancel()
		}
		msg := idem.Message{ID: tc.name, Payload: []byte("p")}
		out, err := c.Process(ctx, msg, tc.handler(cancel))
		cancel()
		proxy.Slow(0)
		if out.Ack() {
			t.Errorf("%s: %v, %v: acknowledged under a cancelled context", tc.name, out.Status, err)
		}
		if !errors.Is(err, context.Canceled) && !errors.Is(err, idem.ErrStore) {
			t.Errorf("%s: error %v, want the cancellation or a store error", tc.name, err)
		}
		again, err := c.Process(context.Background(), msg, direct.effectHandler())
		if !again.Ack() {
			t.Errorf("%s: redelivery: %v, %v; want processed or duplicate", tc.name, again.Status, err)
		}
		t.Logf("%s: %v, then %v", tc.name, out.Status, again.Status)
		if n := direct.countEffects(t, tc.name); n != 1 {
			t.Errorf("%s: %d effects, want 1", tc.name, n)
		}
	}
	if n := direct.countRecords(t, "cancel"); n != 4 {
		t.Errorf("%d records, want 4", n)
	}
	checkPool(t, pool)
	idleConnsTakeLongCalls(t, pool, storeTimeout/4)
}

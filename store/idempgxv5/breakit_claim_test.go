package idempgxv5_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/faultproxy"
	"github.com/idem-go/idem/store/idempgxv5"
)

// namedPool opens a pool of maxConns connections on url whose sessions
// carry application_name app, so that a test can find (and terminate)
// their backends.
func namedPool(t *testing.T, url, app string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// seedDuplicate claims and commits message m of consumer c, so that the
// next claim of it is a duplicate.
func seedDuplicate(t *testing.T, s *idempgxv5.Store, m string) {
	t.Helper()
	ctx := context.Background()
	tx, res, err := s.BeginClaim(ctx, &idemdriver.ClaimParams{Consumer: "c", MessageID: m, Fingerprint: fp("x")})
	if err != nil || !res.Claimed {
		t.Fatalf("BeginClaim = %+v, %v", res, err)
	}
	if err := s.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
}

// wantDuplicate checks that a BeginClaim of m is a duplicate the store
// ended, with the stored fingerprint.
func wantDuplicate(t *testing.T, s *idempgxv5.Store, m string) {
	t.Helper()
	tx, res, err := s.BeginClaim(context.Background(), &idemdriver.ClaimParams{Consumer: "c", MessageID: m, Fingerprint: fp("x")})
	if err != nil || res.Claimed || !res.Ended || tx != nil || !bytes.Equal(res.Fingerprint, fp("x")) {
		t.Fatalf("BeginClaim of a duplicate = %v, %+v, %v; want an ended duplicate with the stored fingerprint", tx, res, err)
	}
}

// TestBreakBeginClaimDuplicateFaults puts a fault between a duplicate's
// conflicting claim and the pipelined read and ROLLBACK: the caller's
// context cancelled, the backend terminated, the connection stalled, the
// answer cut. Each time BeginClaim returns an error (never a claim, never
// an ended duplicate it could not read), no connection stays acquired,
// every idle connection is usable and outside a transaction, and the next
// duplicate is read as one.
func TestBreakBeginClaimDuplicateFaults(t *testing.T) {
	ctx := context.Background()

	t.Run("ContextCancelled", func(t *testing.T) {
		b := setup(t, poolOpts{maxConns: 1})
		seedDuplicate(t, b.store, "m")
		cctx, cancel := context.WithCancel(ctx)
		defer idempgxv5.SetAfterConflict(cancel)()
		tx, res, err := b.store.BeginClaim(cctx, &idemdriver.ClaimParams{Consumer: "c", MessageID: "m", Fingerprint: fp("x")})
		if !errors.Is(err, context.Canceled) || tx != nil || (res.Claimed || res.Ended) {
			t.Fatalf("BeginClaim cancelled after the conflict = %v, %+v, %v; want context.Canceled and nothing else", tx, res, err)
		}
		idempgxv5.SetAfterConflict(nil)
		checkPool(t, b.pool)
		wantDuplicate(t, b.store, "m")
		checkPool(t, b.pool)
	})

	t.Run("BackendTerminated", func(t *testing.T) {
		app := randName("breakit_")
		pool := namedPool(t, testURL(t), app, 1)
		b := setupOn(t, pool)
		admin := newPool(t, poolOpts{maxConns: 1})
		seedDuplicate(t, b.store, "m")
		terminated := 0
		defer idempgxv5.SetAfterConflict(func() {
			if err := admin.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&terminated); err != nil {
				t.Error(err)
			}
		})()
		tx, res, err := b.store.BeginClaim(ctx, &idemdriver.ClaimParams{Consumer: "c", MessageID: "m", Fingerprint: fp("x")})
		if err == nil || tx != nil || (res.Claimed || res.Ended) || terminated != 1 {
			t.Fatalf("BeginClaim whose backend died after the conflict = %v, %+v, %v (%d terminated); want an error and nothing else", tx, res, err, terminated)
		}
		idempgxv5.SetAfterConflict(nil)
		checkPool(t, pool)
		wantDuplicate(t, b.store, "m")
		checkPool(t, pool)
	})

	t.Run("Stalled", func(t *testing.T) {
		b := setup(t, poolOpts{maxConns: 1})
		proxy, u := faultproxy.URL(t, testURL(t))
		pool := newPool(t, poolOpts{maxConns: 2, url: u})
		s, err := idempgxv5.New(pool, &idempgxv5.Config{Table: b.table})
		if err != nil {
			t.Fatal(err)
		}
		seedDuplicate(t, s, "m")
		stalled := 0
		defer idempgxv5.SetAfterConflict(func() { stalled = proxy.Stall() })()
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		tx, res, err := s.BeginClaim(cctx, &idemdriver.ClaimParams{Consumer: "c", MessageID: "m", Fingerprint: fp("x")})
		if !errors.Is(err, context.DeadlineExceeded) || tx != nil || (res.Claimed || res.Ended) || stalled < 1 {
			t.Fatalf("BeginClaim stalled after the conflict = %v, %+v, %v (%d stalled); want context.DeadlineExceeded and nothing else", tx, res, err, stalled)
		}
		idempgxv5.SetAfterConflict(nil)
		// The stalled connection is not given back (pgx destroys it, which
		// takes up to its 15 s on a stalled socket): the next claim opens a
		// new one, through the proxy, which forwards new connections.
		wantDuplicate(t, s, "m")
		if n := pool.Stat().AcquiredConns(); n > 1 {
			t.Errorf("%d connections acquired during the stall; want at most the stalled one", n)
		}
		proxy.Close() // ends the stall: the stalled connection's destruction ends
		noneAcquired(t, pool)
	})

	t.Run("AnswerCut", func(t *testing.T) {
		proxy, u := faultproxy.URL(t, testURL(t))
		b := setup(t, poolOpts{maxConns: 1, url: u})
		seedDuplicate(t, b.store, "m")
		defer idempgxv5.SetAfterConflict(func() { proxy.CutAnswers(time.Hour) })()
		tx, res, err := b.store.BeginClaim(ctx, &idemdriver.ClaimParams{Consumer: "c", MessageID: "m", Fingerprint: fp("x")})
		if err == nil || tx != nil || (res.Claimed || res.Ended) {
			t.Fatalf("BeginClaim whose read was cut = %v, %+v, %v; want an error and nothing else", tx, res, err)
		}
		idempgxv5.SetAfterConflict(nil)
		proxy.CutAnswers(0)
		wantDuplicate(t, b.store, "m")
		checkPool(t, b.pool)
	})
}

// TestBreakBeginClaimDuplicatesNoLeak runs duplicates, new claims rolled
// back and committed twice, and claims whose context ends at once from
// many goroutines on a small pool, on PostgreSQL and through PgBouncer in
// transaction pooling: no connection leaks, none is left in a
// transaction, and the committed records are exactly the new ones.
func TestBreakBeginClaimDuplicatesNoLeak(t *testing.T) {
	t.Run("PostgreSQL", func(t *testing.T) { t.Parallel(); claimNoLeak(t, poolOpts{maxConns: 3}) })
	for _, mode := range bouncerModes {
		t.Run("PgBouncer"+modeName(mode), func(t *testing.T) {
			t.Parallel()
			claimNoLeak(t, poolOpts{maxConns: 3, mode: mode, url: bouncerURL(t)})
		})
	}
}

func claimNoLeak(t *testing.T, o poolOpts) {
	ctx := context.Background()
	b := setup(t, o)
	seedDuplicate(t, b.store, "dup")
	const workers, rounds = 8, 60
	var wg sync.WaitGroup
	errs := make(chan error, workers*rounds)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				switch i % 4 {
				case 0: // a duplicate
					tx, res, err := b.store.BeginClaim(ctx, &idemdriver.ClaimParams{Consumer: "c", MessageID: "dup", Fingerprint: fp("x")})
					if err != nil || !res.Ended || tx != nil {
						errs <- fmt.Errorf("duplicate: %v %+v %v", tx, res, err)
					}
					if err := b.store.Rollback(ctx, tx); err != nil {
						errs <- fmt.Errorf("Rollback(nil): %w", err)
					}
				case 1: // a new message, committed, then committed and rolled back again
					tx, res, err := b.store.BeginClaim(ctx, &idemdriver.ClaimParams{Consumer: "c", MessageID: fmt.Sprintf("new-%d-%d", w, i), Fingerprint: fp("x")})
					if err != nil || !res.Claimed {
						errs <- fmt.Errorf("new: %+v %v", res, err)
						continue
					}
					if err := b.store.Commit(ctx, tx); err != nil {
						errs <- fmt.Errorf("Commit: %w", err)
					}
					if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxClosed) {
						errs <- fmt.Errorf("second Commit = %v, want pgx.ErrTxClosed", err)
					}
					if err := b.store.Rollback(ctx, tx); err != nil {
						errs <- fmt.Errorf("Rollback after Commit = %v, want nil", err)
					}
				case 2: // a new message rolled back twice
					tx, res, err := b.store.BeginClaim(ctx, &idemdriver.ClaimParams{Consumer: "c", MessageID: fmt.Sprintf("gone-%d-%d", w, i), Fingerprint: fp("x")})
					if err != nil || !res.Claimed {
						errs <- fmt.Errorf("new: %+v %v", res, err)
						continue
					}
					if err := b.store.Rollback(ctx, tx); err != nil {
						errs <- fmt.Errorf("Rollback: %w", err)
					}
					if err := b.store.Rollback(ctx, tx); err != nil {
						errs <- fmt.Errorf("second Rollback: %w", err)
					}
					if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxClosed) {
						errs <- fmt.Errorf("Commit after Rollback = %v, want pgx.ErrTxClosed", err)
					}
				case 3: // a context that has ended
					cctx, cancel := context.WithCancel(ctx)
					cancel()
					tx, _, err := b.store.BeginClaim(cctx, &idemdriver.ClaimParams{Consumer: "c", MessageID: "dup", Fingerprint: fp("x")})
					if !errors.Is(err, context.Canceled) || tx != nil {
						errs <- fmt.Errorf("ended context: %v %v", tx, err)
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if st := b.pool.Stat(); st.TotalConns() > 3 {
		t.Errorf("%d connections, more than the pool's 3", st.TotalConns())
	}
	checkPool(t, b.pool)
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.store.Table()).Scan(&n); err != nil || n != 1+workers*rounds/4 {
		t.Errorf("%d records, %v; want %d (the duplicate and the committed new ones)", n, err, 1+workers*rounds/4)
	}
}

// TestBreakProcessDuplicateFaults: through Consumer.Process, a redelivery
// whose read of the stored record fails (the context cancelled, the
// backend terminated between the conflicting claim and the read) is not
// acknowledged and runs no handler; the next redelivery is a Duplicate,
// acknowledged, and the effect was written once.
func TestBreakProcessDuplicateFaults(t *testing.T) {
	ctx := context.Background()
	app := randName("breakit_")
	pool := namedPool(t, testURL(t), app, 2)
	b := setupOn(t, pool)
	admin := newPool(t, poolOpts{maxConns: 1})
	c := b.consumer(t, "dup-faults")
	msg := idem.Message{ID: "m", Payload: []byte("p")}
	if out, err := c.Process(ctx, msg, b.effectHandler()); err != nil || out.Status != idem.Processed {
		t.Fatalf("first delivery: %v, %v", out.Status, err)
	}
	ran := 0
	counting := func(ctx context.Context, tx pgx.Tx, m idem.Message) error { ran++; return nil }

	cctx, cancel := context.WithCancel(ctx)
	restore := idempgxv5.SetAfterConflict(cancel)
	out, err := c.Process(cctx, msg, counting)
	restore()
	if err == nil || out.Ack() {
		t.Errorf("redelivery cancelled after the conflict: %v, %v; want an error, not acknowledged", out.Status, err)
	}

	restore = idempgxv5.SetAfterConflict(func() {
		if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE application_name = $1 AND state = 'idle in transaction'`, app); err != nil {
			t.Error(err)
		}
	})
	out, err = c.Process(ctx, msg, counting)
	restore()
	if err == nil || out.Ack() {
		t.Errorf("redelivery whose backend died after the conflict: %v, %v; want an error, not acknowledged", out.Status, err)
	}

	out, err = c.Process(ctx, msg, counting)
	if err != nil || out.Status != idem.Duplicate || !out.Ack() {
		t.Errorf("redelivery after the faults: %v, %v; want an acknowledged Duplicate", out.Status, err)
	}
	if ran != 0 || b.countEffects(t, "m") != 1 {
		t.Errorf("handler ran %d times on redeliveries, %d effects; want 0 and 1", ran, b.countEffects(t, "m"))
	}
	checkPool(t, pool)
}

// TestBreakHandlerEndsItsTx: a handler that ends the transaction it was
// given (Rollback, or Commit, which the core's commit then finds ended)
// and returns nil: a rolled-back delivery is not acknowledged and its
// redelivery runs the handler again; a committed one is a Duplicate on
// redelivery. No connection leaks either way.
func TestBreakHandlerEndsItsTx(t *testing.T) {
	ctx := context.Background()
	b := setup(t, poolOpts{maxConns: 2})
	c := b.consumer(t, "ends-tx")

	out, err := c.Process(ctx, idem.Message{ID: "rolled", Payload: []byte("p")}, func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
		if err := b.writeEffect(ctx, tx, m.ID); err != nil {
			return err
		}
		return tx.Rollback(ctx)
	})
	if out.Ack() || err == nil {
		t.Errorf("handler rolled its transaction back: %v, %v; want an error, not acknowledged", out.Status, err)
	}
	if out, err := c.Process(ctx, idem.Message{ID: "rolled", Payload: []byte("p")}, b.effectHandler()); err != nil || out.Status != idem.Processed {
		t.Errorf("redelivery after the handler's rollback: %v, %v; want Processed", out.Status, err)
	}
	if n := b.countEffects(t, "rolled"); n != 1 {
		t.Errorf("%d effects of the rolled-back message, want 1 (the redelivery's)", n)
	}

	out, err = c.Process(ctx, idem.Message{ID: "committed", Payload: []byte("p")}, func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
		if err := b.writeEffect(ctx, tx, m.ID); err != nil {
			return err
		}
		return tx.Commit(ctx)
	})
	t.Logf("handler committed its transaction itself: %v, %v", out.Status, err)
	if out, err := c.Process(ctx, idem.Message{ID: "committed", Payload: []byte("p")}, b.effectHandler()); err != nil || out.Status != idem.Duplicate {
		t.Errorf("redelivery after the handler's own commit: %v, %v; want Duplicate", out.Status, err)
	}
	if n := b.countEffects(t, "committed"); n != 1 {
		t.Errorf("%d effects of the committed message, want 1", n)
	}
	checkPool(t, b.pool)
}

package idemsql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idemsql"
)

// openSQLiteStore opens dsn as a Store of its own *sql.DB (closed at the
// end of the test).
func openSQLiteStore(t *testing.T, dsn string, conns int) (*sql.DB, *idemsql.Store) {
	t.Helper()
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	s, err := idemsql.New(db, idemsql.SQLite, nil)
	if err != nil {
		t.Fatal(err)
	}
	return db, s
}

// TestSQLiteWritersDoNotStarve runs many more writers than one SQLite
// database turns over, on one file with a busy timeout of 2 ms (a DSN of
// the test's own; SQLiteDSN sets 10 s), through two Stores, each on a
// *sql.DB of its own: lease-mode messages (Acquire, Renew, Complete: a
// transaction and two single statements) and transactional ones (Begin,
// ClaimTx, Commit). Every write lands, none fails with SQLITE_BUSY: the
// writers of the process queue at the write gate the two Stores share,
// instead of meeting in SQLite's busy handler, where a writer sleeping
// between its tries loses the lock to the others until its timeout
// (without the gate this test saw most of its writers fail).
func TestSQLiteWritersDoNotStarve(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "starve.db")
	dsn := "file:" + path + "?_txlock=immediate&_pragma=busy_timeout(2)&_pragma=journal_mode(WAL)"
	db, s1 := openSQLiteStore(t, dsn, 4)
	_, s2 := openSQLiteStore(t, dsn, 4)
	if err := s1.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	const writers, each = 16, 20
	var (
		failed atomic.Int64
		first  sync.Once
		firstE error
		wg     sync.WaitGroup
	)
	fail := func(what string, err error) {
		failed.Add(1)
		first.Do(func() { firstE = fmt.Errorf("%s: %w", what, err) })
	}
	for w := range writers {
		s := s1
		if w%2 == 1 {
			s = s2
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				id := fmt.Sprintf("w%02d-%03d", w, i)
				if i%2 == 0 {
					leaseMessage(ctx, s, id, fail)
				} else {
					txMessage(ctx, s, id, fail)
				}
			}
		}()
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Errorf("%d of %d messages failed; the first: %v", n, writers*each, firstE)
	}
	var leased, claimed int
	err := db.QueryRowContext(ctx, `SELECT
		coalesce(sum(consumer = 'lease' AND state = ?), 0),
		coalesce(sum(consumer = 'tx'), 0)
		FROM idem_processed`, int(idemdriver.StateCompleted)).Scan(&leased, &claimed)
	if err != nil {
		t.Fatal(err)
	}
	if want := writers * each / 2; leased != want || claimed != want {
		t.Errorf("completed lease-mode records %d, transactional records %d; want %d each", leased, claimed, want)
	}
}

// leaseMessage acquires id's lease, renews it and completes it, reporting
// a failure to fail.
func leaseMessage(ctx context.Context, s *idemsql.Store, id string, fail func(string, error)) {
	fp := []byte("fingerprint")
	res, err := s.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "lease", MessageID: id, Fingerprint: fp, Lease: time.Minute})
	if err != nil || !res.Acquired {
		fail("Acquire "+id, errors.Join(err, fmt.Errorf("result %+v", res)))
		return
	}
	if err := s.Renew(ctx, &idemdriver.RenewParams{Consumer: "lease", MessageID: id, Token: res.Token, Lease: time.Minute}); err != nil {
		fail("Renew "+id, err)
		return
	}
	if err := s.Complete(ctx, &idemdriver.CompleteParams{Consumer: "lease", MessageID: id, Token: res.Token, Result: []byte("r")}); err != nil {
		fail("Complete "+id, err)
	}
}

// txMessage claims id in a transaction of Store.Begin and commits it,
// reporting a failure to fail.
func txMessage(ctx context.Context, s *idemsql.Store, id string, fail func(string, error)) {
	tx, err := s.Begin(ctx)
	if err != nil {
		fail("Begin "+id, err)
		return
	}
	res, err := s.ClaimTx(ctx, tx, &idemdriver.ClaimParams{Consumer: "tx", MessageID: id, Fingerprint: []byte("fingerprint")})
	if err != nil || !res.Claimed {
		_ = s.Rollback(ctx, tx)
		fail("ClaimTx "+id, errors.Join(err, fmt.Errorf("result %+v", res)))
		return
	}
	if err := s.Commit(ctx, tx); err != nil {
		fail("Commit "+id, err)
	}
}

// waitForWaiters spins until n writers wait at s's write gate.
func waitForWaiters(t *testing.T, s *idemsql.Store, n int) {
	t.Helper()
	for {
		if _, w := idemsql.SQLiteWriteGate(s); w == n {
			return
		}
		if t.Context().Err() != nil {
			t.Fatalf("never saw %d writers waiting at the gate", n)
		}
		runtime.Gosched()
	}
}

// wantGate checks whether s's write gate is held.
func wantGate(t *testing.T, s *idemsql.Store, what string, held bool) {
	t.Helper()
	if h, w := idemsql.SQLiteWriteGate(s); h != held || w != 0 {
		t.Errorf("%s: gate held %v with %d waiting, want held %v with none", what, h, w, held)
	}
}

// A transaction of Store.Begin holds the write gate from Begin to its
// Commit or Rollback, whatever their outcome, and a second Store on the
// same file (its own *sql.DB) waits for it; a wait cut short by its
// context returns an error matching ctx's and leaves the queue.
func TestSQLiteBeginHoldsTheGateUntilItEnds(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dsn := idemsql.SQLiteDSN(filepath.Join(t.TempDir(), "gate.db"))
	_, s := openSQLiteStore(t, dsn, 4)
	_, other := openSQLiteStore(t, dsn, 4)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	wantGate(t, s, "before Begin", false)

	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantGate(t, other, "after Begin, seen from the other Store", true)
	renewed := make(chan error, 1)
	go func() {
		renewed <- other.Renew(ctx, &idemdriver.RenewParams{Consumer: "c", MessageID: "m", Token: 1, Lease: time.Minute})
	}()
	waitForWaiters(t, s, 1)
	cctx, cancel := context.WithCancel(ctx)
	begun := make(chan error, 1)
	go func() {
		tx, err := s.Begin(cctx)
		if err == nil {
			_ = s.Rollback(ctx, tx)
		}
		begun <- err
	}()
	waitForWaiters(t, s, 2)
	cancel()
	if err := <-begun; !errors.Is(err, context.Canceled) {
		t.Errorf("Begin whose context ended at the gate = %v, want context.Canceled", err)
	}
	waitForWaiters(t, s, 1)
	if err := s.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if err := <-renewed; !errors.Is(err, idemdriver.ErrLeaseLost) {
		t.Errorf("Renew after the gate came back = %v, want ErrLeaseLost (no such record)", err)
	}
	wantGate(t, s, "after Commit and the waiting Renew", false)

	tx, err = s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Rollback(ctx, tx); err != nil { // any Store of the file ends it
		t.Fatal(err)
	}
	wantGate(t, s, "after Rollback", false)

	// A transaction whose context ended: database/sql rolled it back, the
	// Commit fails, and the gate comes back all the same (given back by
	// the end of the context, or by the Commit).
	bctx, cancelTx := context.WithCancel(ctx)
	tx, err = s.Begin(bctx)
	if err != nil {
		t.Fatal(err)
	}
	cancelTx()
	if err := s.Commit(ctx, tx); err == nil {
		t.Error("Commit of a transaction whose context ended = nil, want an error")
	}
	waitGateFree(t, s)
	if err := s.Rollback(ctx, tx); err != nil {
		t.Errorf("Rollback after the failed Commit = %v, want nil", err)
	}
	wantGate(t, s, "after Rollback of the ended transaction", false)

	// Ended with tx.Commit, bypassing the Store: the gate stays held
	// until the context of Begin ends.
	bctx, cancelTx = context.WithCancel(ctx)
	defer cancelTx()
	tx, err = s.Begin(bctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	wantGate(t, s, "after tx.Commit", true)
	cancelTx()
	waitGateFree(t, s)
}

// waitGateFree spins until s's write gate is free, with no waiter.
func waitGateFree(t *testing.T, s *idemsql.Store) {
	t.Helper()
	for {
		if h, w := idemsql.SQLiteWriteGate(s); !h && w == 0 {
			return
		}
		if t.Context().Err() != nil {
			t.Fatal("the write gate was never given back")
		}
		runtime.Gosched()
	}
}

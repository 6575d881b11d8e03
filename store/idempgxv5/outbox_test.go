package idempgxv5_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemtest"
	"github.com/jackc/pgx/v5"
)

// TestOutboxConformance runs idem's outbox conformance suite on pgx, each
// case on its own pool and tables: a Relay's Run here listens for the
// outbox table's notifications (idemdriver.OutboxNotifier).
func TestOutboxConformance(t *testing.T) {
	testURL(t)
	idemtest.RunOutbox(t, harness(pgx.QueryExecModeCacheStatement))
}

// TestOutboxPurgeSkipsLockedRows holds a row lock on one expired sent row
// in another transaction, as a second relay's purge does while it deletes
// it: PurgeOutbox deletes the others without waiting for that lock, and the
// row once the lock is gone. Before the purge's selection skipped locked
// rows it waited here until its context ended (and two purges locking the
// same rows in different orders deadlocked).
func TestOutboxPurgeSkipsLockedRows(t *testing.T) {
	bb := setup(t, poolOpts{maxConns: 4})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := bb.pool.Exec(ctx, `INSERT INTO `+bb.table+`_outbox (id, destination, payload, sent_at)
		SELECT 'r-' || g, 'd', '\x7b7d'::bytea, now() - interval '1 hour' FROM generate_series(1, 5) g`); err != nil {
		t.Fatal(err)
	}
	tx, err := bb.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT FROM `+bb.table+`_outbox WHERE id = 'r-3' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	p := &idemdriver.PurgeOutboxParams{Retention: time.Minute, Limit: 100}
	if n, err := bb.store.PurgeOutbox(ctx, p); err != nil || n != 4 {
		t.Fatalf("PurgeOutbox beside a locked row = %d, %v; want 4 deleted, no wait", n, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := bb.store.PurgeOutbox(ctx, p); err != nil || n != 1 {
		t.Fatalf("PurgeOutbox after the lock = %d, %v; want 1", n, err)
	}
}

// TestOutboxLeaseCountsFromTheLock: a claim that waits for a lock (here
// another transaction's table lock) leases its rows from when it got
// them, not from when its statement started: the relay gives the publish
// half the lease from when the claim returns, so a lease counted from
// before the wait could end while the publish still runs, and another
// relay would send the row at the same time. It used to count from now(),
// the statement's start. (The simple protocol, so that the wait happens in
// the claim's own execution: a statement not yet prepared would wait in
// its preparation, before the execution's transaction starts.)
func TestOutboxLeaseCountsFromTheLock(t *testing.T) {
	bb := setup(t, poolOpts{maxConns: 4, mode: pgx.QueryExecModeSimpleProtocol})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	outbox := bb.table + "_outbox"
	if _, err := bb.pool.Exec(ctx, `INSERT INTO `+outbox+` (id, destination, payload) VALUES ('r-1', 'd', '\x7b7d')`); err != nil {
		t.Fatal(err)
	}
	lock, err := bb.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(ctx) }()
	if _, err := lock.Exec(ctx, `LOCK TABLE `+outbox+` IN SHARE ROW EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	claimed := make(chan error, 1)
	go func() {
		recs, err := bb.store.ClaimOutgoing(ctx, &idemdriver.ClaimOutgoingParams{Limit: 10, Lease: time.Hour})
		if err == nil && len(recs) != 1 {
			err = fmt.Errorf("claimed %d rows, want 1", len(recs))
		}
		claimed <- err
	}()
	// Once the claim waits for the lock, read the server's clock.
	var waiting bool
	for !waiting {
		if err := bb.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_locks WHERE relation = $1::regclass AND NOT granted)`, outbox).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
	}
	var during time.Time
	if err := bb.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&during); err != nil {
		t.Fatal(err)
	}
	if err := lock.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-claimed; err != nil {
		t.Fatal(err)
	}
	var until time.Time
	if err := bb.pool.QueryRow(ctx, `SELECT lease_until FROM `+outbox).Scan(&until); err != nil {
		t.Fatal(err)
	}
	if min := during.Add(time.Hour); until.Before(min) {
		t.Errorf("lease until %v, want at least %v: an hour from after the lock wait, not from before it", until, min)
	}
}

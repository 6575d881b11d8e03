package idempgxv5_test

import (
	"context"
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

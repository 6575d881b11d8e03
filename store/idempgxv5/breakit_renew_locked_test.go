package idempgxv5_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// TestBreakRenewalsOneRowLocked: 40 attempts held by one LeaseConsumer at
// a 1.5s lease (renewed every 0.5s) while another transaction holds one
// of their records' rows locked (SELECT ... FOR UPDATE, as an operator's
// query or a long purge might) for two leases. That attempt's renewals
// wait on the row lock, and its lease may run out by the local clock;
// the other 39 renewals must keep landing: none of their contexts ends,
// each Complete succeeds. Whatever batches renewals must keep this: one
// statement renewing many rows waits on the one locked row, and would
// cost every lease in it.
func TestBreakRenewalsOneRowLocked(t *testing.T) {
	ctx := context.Background()
	b := setup(t, poolOpts{maxConns: 8})
	const n, lease = 40, 1500 * time.Millisecond
	c, err := idem.NewLeaseConsumer(b.store, idem.Config{Name: "held", Lease: lease, PurgeInterval: -1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	attempts := make([]*idem.Attempt, n)
	for i := range attempts {
		a, out, err := c.Acquire(ctx, idem.Message{ID: fmt.Sprintf("m-%02d", i), Payload: []byte("p")}, idem.AcquireOptions{})
		if a == nil {
			t.Fatalf("Acquire m-%02d: %v %v", i, out, err)
		}
		attempts[i] = a
	}
	const locked = 0
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var one int
	if err := tx.QueryRow(ctx, `SELECT 1 FROM `+b.table+` WHERE message_id = $1 FOR UPDATE`, attempts[locked].Message.ID).Scan(&one); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * lease) // the lock is held through several renewal ticks
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	lost := 0
	for i, a := range attempts {
		if i == locked {
			t.Logf("the locked record's attempt: context %v (cause %v)", a.Context().Err(), context.Cause(a.Context()))
			if _, err := a.Complete(ctx, idem.Result{}); err != nil {
				t.Logf("the locked record's attempt's Complete: %v", err)
			}
			continue
		}
		if err := a.Context().Err(); err != nil {
			lost++
			t.Errorf("%s: context ended (%v) while another record's row was locked", a.Message.ID, context.Cause(a.Context()))
		}
		if out, err := a.Complete(ctx, idem.Result{}); err != nil || out.Status != idem.Processed {
			t.Errorf("%s: Complete = %v, %v; want processed", a.Message.ID, out.Status, err)
		}
	}
	t.Logf("%d of %d attempts beside the locked row lost their lease", lost, n-1)
	checkPool(t, b.pool)
}

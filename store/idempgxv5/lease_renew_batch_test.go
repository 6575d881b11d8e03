package idempgxv5_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// A renewal batch does not wait for a record another transaction holds
// locked (an operator's open transaction, a Complete in flight): it
// renews the others at once and leaves that one unjudged
// (idemdriver.ErrRenewNotJudged, not ErrLeaseLost), which a later batch
// renews once the lock is gone. The statement returns while the lock is
// held: within 5s, where waiting would block until the transaction ends.
func TestRenewBatchSkipsLockedRecords(t *testing.T) {
	t.Parallel()
	bb := setup(t, poolOpts{})
	ctx := t.Context()
	const consumer = "renew-batch"
	fp, _ := idem.SHA256Fingerprint([]byte("p"))
	ids := []string{"a", "b", "c"}
	ps := make([]idemdriver.RenewParams, len(ids))
	for i, id := range ids {
		res, err := bb.store.Acquire(ctx, &idemdriver.AcquireParams{Consumer: consumer, MessageID: id, Fingerprint: fp, Lease: time.Minute})
		if err != nil || !res.Acquired {
			t.Fatalf("Acquire %s: %+v %v", id, res, err)
		}
		ps[i] = idemdriver.RenewParams{Consumer: consumer, MessageID: id, Token: res.Token, Lease: time.Hour}
	}
	tx, err := bb.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM `+bb.table+` WHERE `+keyOf(bb.table, `$1`)+` AND message_id = 'b' FOR UPDATE`, consumer); err != nil {
		t.Fatal(err)
	}
	bctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	errs, err := bb.store.RenewBatch(bctx, ps)
	cancel()
	if err != nil {
		t.Fatalf("RenewBatch with b locked: %v", err)
	}
	if errs[0] != nil || errs[2] != nil || !errors.Is(errs[1], idemdriver.ErrRenewNotJudged) || errors.Is(errs[1], idem.ErrLeaseLost) {
		t.Fatalf("RenewBatch with b locked: %v; want a and c renewed, b not judged (not lost)", errs)
	}
	left := func(id string) time.Duration {
		res, err := bb.store.Acquire(ctx, &idemdriver.AcquireParams{Consumer: consumer, MessageID: id, Fingerprint: fp, Lease: time.Minute})
		if err != nil || res.Acquired {
			t.Fatalf("Acquire %s while held: %+v %v", id, res, err)
		}
		return res.LeaseRemaining
	}
	if l := left("a"); l <= time.Minute {
		t.Errorf("a: %v of lease left after the batch, want more than a minute (renewed for an hour)", l)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if l := left("b"); l > time.Minute {
		t.Errorf("b: %v of lease left, want at most its first minute (not renewed while locked)", l)
	}
	errs, err = bb.store.RenewBatch(ctx, ps)
	if err != nil || errs[0] != nil || errs[1] != nil || errs[2] != nil {
		t.Fatalf("RenewBatch once the lock is gone: %v %v; want every lease renewed", errs, err)
	}
	if l := left("b"); l <= time.Minute {
		t.Errorf("b: %v of lease left after the second batch, want more than a minute", l)
	}
}

package idempgxv5_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
)

// TestLeaseBatchPlansAgainAsTableGrows: on a new table that nothing
// analyzes (autovacuum off for it), lease batches of 64 new messages,
// each completed in a batch, grow it to 20,480 records. A prepared
// statement's generic plan made while the table was small joins the
// batch's IDs with a sequential scan of the whole table; the batch
// statements are prepared again as the records this process acquired
// double, so that once the table is large its batches probe the primary
// key: the last 3,000 or so records' batches scan nothing.
func TestLeaseBatchPlansAgainAsTableGrows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, poolOpts{maxConns: 1})
	s := b.store
	if _, err := b.pool.Exec(ctx, `ALTER TABLE `+b.table+` SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	// The pool's one connection runs the batches, so that the flush of
	// its table statistics (pg_stat_force_next_flush: at the end of the
	// next statement, before its answer) holds all of them.
	seqScans := func() int64 {
		t.Helper()
		if _, err := b.pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
			t.Fatal(err)
		}
		var n int64
		if err := b.pool.QueryRow(ctx, `SELECT seq_scan FROM pg_stat_user_tables WHERE relid = $1::regclass`, b.table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	const batch, total, measured = 64, 20480, 3072
	var before int64
	for done := 0; done < total; done += batch {
		if done == total-measured {
			before = seqScans()
		}
		ps := make([]*idemdriver.AcquireParams, batch)
		for i := range ps {
			ps[i] = &idemdriver.AcquireParams{Consumer: "c", MessageID: fmt.Sprintf("m-%06d", done+i), Fingerprint: fp("x"), Lease: time.Minute, StepPrefix: "run:"}
		}
		res, errs, err := s.AcquireBatch(ctx, ps)
		if err != nil {
			t.Fatalf("AcquireBatch at %d: %v", done, err)
		}
		cs := make([]*idemdriver.CompleteParams, batch)
		for i, r := range res {
			if errs[i] != nil || !r.Acquired {
				t.Fatalf("AcquireBatch at %d, element %d: %+v, %v", done, i, r, errs[i])
			}
			cs[i] = &idemdriver.CompleteParams{Consumer: "c", MessageID: ps[i].MessageID, Token: r.Token}
		}
		errs, err = s.CompleteBatch(ctx, cs)
		if err != nil {
			t.Fatalf("CompleteBatch at %d: %v", done, err)
		}
		for i, e := range errs {
			if e != nil {
				t.Fatalf("CompleteBatch at %d, element %d: %v", done, i, e)
			}
		}
	}
	if n := seqScans() - before; n != 0 {
		t.Errorf("%d sequential scans of the table in the batches of its last %d records (of %d), want 0", n, measured, total)
	}
	var completed int64
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.table+` WHERE state = 2`).Scan(&completed); err != nil {
		t.Fatal(err)
	}
	if completed != total {
		t.Errorf("%d records completed, want %d", completed, total)
	}
}

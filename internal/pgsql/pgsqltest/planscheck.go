package pgsqltest

import (
	"context"
	"crypto/sha256"
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
)

// CheckBatchPlansAgainAsTableGrows grows table, new and never analyzed
// (the caller turns autovacuum off for it), to 20,480 records of consumer
// "c" in lease batches of 64 new messages through s, each batch completed
// in one CompleteBatch, and fails when the batches of the last 3,072
// records scanned the table sequentially, or when fewer than 20,480
// records end completed. q must run on the one connection s uses (a pool
// of one), so that the flush of that connection's table statistics
// (pg_stat_force_next_flush, at the end of its next statement) holds every
// batch's.
//
// A prepared statement's generic plan made while the table was small
// joins a batch's IDs with a sequential scan of the whole table; the
// stores prepare the batch statements again as the records they acquired
// in batches double (a plan generation in the statement's text), so that
// once the table is large the batches probe its primary key.
func CheckBatchPlansAgainAsTableGrows(tb testing.TB, ctx context.Context, s idemdriver.LeaseBatcher, q QueryRow, table string) {
	tb.Helper()
	seqScans := func() int64 {
		tb.Helper()
		var one int
		if err := q(ctx, []any{&one}, `SELECT 1 FROM (SELECT pg_stat_force_next_flush()) f`); err != nil {
			tb.Fatal(err)
		}
		var n int64
		if err := q(ctx, []any{&n}, `SELECT seq_scan FROM pg_stat_user_tables WHERE relid = $1::regclass`, table); err != nil {
			tb.Fatal(err)
		}
		return n
	}
	sum := sha256.Sum256([]byte("x"))
	const batch, total, measured = 64, 20480, 3072
	var before int64
	for done := 0; done < total; done += batch {
		if done == total-measured {
			before = seqScans()
		}
		ps := make([]*idemdriver.AcquireParams, batch)
		for i := range ps {
			ps[i] = &idemdriver.AcquireParams{Consumer: "c", MessageID: fmt.Sprintf("m-%06d", done+i), Fingerprint: sum[:], Lease: time.Minute, StepPrefix: "run:"}
		}
		res, errs, err := s.AcquireBatch(ctx, ps)
		if err != nil {
			tb.Fatalf("AcquireBatch at %d: %v", done, err)
		}
		cs := make([]*idemdriver.CompleteParams, batch)
		for i, r := range res {
			if errs[i] != nil || !r.Acquired {
				tb.Fatalf("AcquireBatch at %d, element %d: %+v, %v", done, i, r, errs[i])
			}
			cs[i] = &idemdriver.CompleteParams{Consumer: "c", MessageID: ps[i].MessageID, Token: r.Token}
		}
		errs, err = s.CompleteBatch(ctx, cs)
		if err != nil {
			tb.Fatalf("CompleteBatch at %d: %v", done, err)
		}
		for i, e := range errs {
			if e != nil {
				tb.Fatalf("CompleteBatch at %d, element %d: %v", done, i, e)
			}
		}
	}
	if n := seqScans() - before; n != 0 {
		tb.Errorf("%d sequential scans of the table in the batches of its last %d records (of %d), want 0", n, measured, total)
	}
	var completed int64
	if err := q(ctx, []any{&completed}, `SELECT count(*) FROM `+table+` WHERE state = 2`); err != nil {
		tb.Fatal(err)
	}
	if completed != total {
		tb.Errorf("%d records completed, want %d", completed, total)
	}
}

package idempgxv5_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// TestLeaseBatchRoundTrips counts the network writes of a lease batch once
// its statements are prepared: AcquireBatch and CompleteBatch of many
// messages are one round trip each (one pipeline, one commit), a takeover
// in the batch adds the read of its recovery points after it, and a stale
// token in a CompleteBatch is refused alone.
func TestLeaseBatchRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var writes atomic.Int64
	b := setup(t, poolOpts{maxConns: 1, countWrites: &writes, noPing: true})
	s := b.store
	params := func(ids ...string) []*idemdriver.AcquireParams {
		ps := make([]*idemdriver.AcquireParams, len(ids))
		for i, id := range ids {
			ps[i] = &idemdriver.AcquireParams{Consumer: "c", MessageID: id, Fingerprint: fp("x"), Lease: time.Minute, StepPrefix: "run:"}
		}
		return ps
	}
	acquire := func(what string, want int64, ps []*idemdriver.AcquireParams) []idemdriver.AcquireResult {
		t.Helper()
		writes.Store(0)
		res, errs, err := s.AcquireBatch(ctx, ps)
		if err != nil {
			t.Fatalf("%s: AcquireBatch: %v", what, err)
		}
		for i, e := range errs {
			if e != nil {
				t.Fatalf("%s: element %d: %v", what, i, e)
			}
		}
		if n := writes.Load(); n != want {
			t.Errorf("%s took %d round trips, want %d", what, n, want)
		}
		return res
	}
	complete := func(what string, want int64, ps []*idemdriver.CompleteParams) []error {
		t.Helper()
		writes.Store(0)
		errs, err := s.CompleteBatch(ctx, ps)
		if err != nil {
			t.Fatalf("%s: CompleteBatch: %v", what, err)
		}
		if n := writes.Load(); n != want {
			t.Errorf("%s took %d round trips, want %d", what, n, want)
		}
		return errs
	}
	// Warm up: prepare the statements on the pool's one connection (the
	// takeover's read of recovery points included). The first call also
	// finds the table's shape and adds the consumer's name to the
	// consumers table, each statement prepared then run.
	w := acquire("warm-up", 6, params("warm-up")) // shape, name, prepare, then the batch
	if err := s.Release(ctx, &idemdriver.ReleaseParams{Consumer: "c", MessageID: "warm-up", Token: w[0].Token, Error: "e"}); err != nil {
		t.Fatal(err)
	}
	w, _, err := s.AcquireBatch(ctx, params("warm-up"))
	if err != nil || !w[0].Acquired {
		t.Fatalf("warm-up takeover: %+v, %v", w, err)
	}
	complete("warm-up", 2, []*idemdriver.CompleteParams{{Consumer: "c", MessageID: "warm-up", Token: w[0].Token}})

	ids := make([]string, 20)
	for i := range ids {
		ids[i] = fmt.Sprintf("m-%02d", i)
	}
	res := acquire("AcquireBatch of 20 new messages", 1, params(ids...))
	cps := make([]*idemdriver.CompleteParams, len(ids))
	for i, r := range res {
		if !r.Acquired || r.Token != 1 || r.Attempt != 1 {
			t.Fatalf("%s: %+v; want acquired, token 1, attempt 1", ids[i], r)
		}
		cps[i] = &idemdriver.CompleteParams{Consumer: "c", MessageID: ids[i], Token: r.Token, Result: []byte("r-" + ids[i])}
	}
	// m-00 is released and taken over before the completions: its first
	// token is stale.
	if err := s.Release(ctx, &idemdriver.ReleaseParams{Consumer: "c", MessageID: "m-00", Token: res[0].Token, Error: "e"}); err != nil {
		t.Fatal(err)
	}
	again := acquire("AcquireBatch with a takeover and a held record", 2, params("m-00", "m-01"))
	if !again[0].Acquired || again[0].Attempt != 2 || again[0].Steps == nil {
		t.Errorf("takeover in the batch = %+v; want acquired, attempt 2, the recovery points read", again[0])
	}
	if _, ok := again[0].Steps["run:1"]; !ok {
		t.Errorf("takeover in the batch: recovery points %v; want run:1, the first attempt's run point", again[0].Steps)
	}
	if again[1].Acquired || again[1].State != idemdriver.StateInProgress {
		t.Errorf("held record in the batch = %+v; want in progress, not acquired", again[1])
	}
	errs := complete("CompleteBatch of 20, one stale", 1, cps)
	for i, e := range errs {
		if i == 0 && !errors.Is(e, idem.ErrLeaseLost) {
			t.Errorf("stale completion of m-00 = %v; want ErrLeaseLost", e)
		}
		if i > 0 && e != nil {
			t.Errorf("completion of %s = %v", ids[i], e)
		}
	}
	for i, id := range ids {
		r, err := s.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "c", MessageID: id, Fingerprint: fp("x"), Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case i == 0 && (r.Acquired || r.State != idemdriver.StateInProgress):
			t.Errorf("m-00 after the stale completion = %+v; want in progress under its takeover", r)
		case i > 0 && (r.State != idemdriver.StateCompleted || string(r.Result) != "r-"+id):
			t.Errorf("%s after the batch = %+v; want completed with r-%s", id, r, id)
		}
	}
	checkPool(t, b.pool)
}

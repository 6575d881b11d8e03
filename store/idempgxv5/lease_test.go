package idempgxv5_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// TestLeaseRoundTrips counts the network writes (one per round trip) of
// each lease-mode call once the statements are prepared: one for an
// Acquire of a new message, of a record with a live lease and of a
// completed one, and for each fenced write; two for a takeover (its
// recovery points are read by a second statement).
func TestLeaseRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var writes atomic.Int64
	b := setup(t, poolOpts{maxConns: 1, countWrites: &writes, noPing: true})
	s := b.store
	acq := func(id string) idemdriver.AcquireResult {
		t.Helper()
		r, err := s.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "c", MessageID: id, Fingerprint: fp("x"), Lease: time.Minute})
		if err != nil {
			t.Fatalf("Acquire(%q): %v", id, err)
		}
		return r
	}
	// Warm up: prepare every statement on the pool's one connection.
	w := acq("warm-up")
	for _, err := range []error{
		s.Renew(ctx, &idemdriver.RenewParams{Consumer: "c", MessageID: "warm-up", Token: w.Token, Lease: time.Minute}),
		s.SaveStep(ctx, &idemdriver.StepParams{Consumer: "c", MessageID: "warm-up", Token: w.Token, Step: "s", Result: []byte("v")}),
		s.Release(ctx, &idemdriver.ReleaseParams{Consumer: "c", MessageID: "warm-up", Token: w.Token, Error: "e"}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	w = acq("warm-up") // a takeover: prepares the steps query
	if err := s.Complete(ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: "warm-up", Token: w.Token}); err != nil {
		t.Fatal(err)
	}

	count := func(what string, want int64, f func()) {
		t.Helper()
		writes.Store(0)
		f()
		if n := writes.Load(); n != want {
			t.Errorf("%s took %d round trips, want %d", what, n, want)
		}
	}
	var a idemdriver.AcquireResult
	count("Acquire of a new message", 1, func() { a = acq("m") })
	if !a.Acquired || a.Token != 1 || a.Attempt != 1 {
		t.Fatalf("Acquire of a new message = %+v", a)
	}
	count("Acquire of a live lease", 1, func() {
		if r := acq("m"); r.Acquired || r.State != idemdriver.StateInProgress || r.LeaseRemaining <= 0 || r.LeaseRemaining > time.Minute {
			t.Errorf("Acquire of a live lease = %+v", r)
		}
	})
	count("Renew", 1, func() {
		if err := s.Renew(ctx, &idemdriver.RenewParams{Consumer: "c", MessageID: "m", Token: a.Token, Lease: time.Minute}); err != nil {
			t.Error(err)
		}
	})
	count("SaveStep", 1, func() {
		if err := s.SaveStep(ctx, &idemdriver.StepParams{Consumer: "c", MessageID: "m", Token: a.Token, Step: "s", Result: []byte("v")}); err != nil {
			t.Error(err)
		}
	})
	count("Release", 1, func() {
		if err := s.Release(ctx, &idemdriver.ReleaseParams{Consumer: "c", MessageID: "m", Token: a.Token, Error: "e"}); err != nil {
			t.Error(err)
		}
	})
	count("a stale Complete", 1, func() {
		if err := s.Complete(ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: "m", Token: a.Token}); !errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("stale Complete = %v, want ErrLeaseLost", err)
		}
	})
	count("Acquire taking over", 2, func() { a = acq("m") })
	if !a.Acquired || a.Token != 3 || a.Attempt != 2 || string(a.Steps["s"]) != "v" {
		t.Errorf("takeover after a release = %+v; want token 3 (the release moved it to 2), attempt 2, step s", a)
	}
	count("Complete", 1, func() {
		if err := s.Complete(ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: "m", Token: a.Token, Result: []byte("r")}); err != nil {
			t.Error(err)
		}
	})
	count("Acquire of a completed record", 1, func() {
		if r := acq("m"); r.Acquired || r.State != idemdriver.StateCompleted || string(r.Result) != "r" {
			t.Errorf("Acquire of a completed record = %+v", r)
		}
	})
	checkPool(t, b.pool)
}

// TestLeaseInspect reads lease-mode records with Inspect, and checks what
// the two modes see of each other's records on one table.
func TestLeaseInspect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, poolOpts{})
	s := b.store
	var serverNow time.Time
	if err := b.pool.QueryRow(ctx, `SELECT now()`).Scan(&serverNow); err != nil {
		t.Fatal(err)
	}
	a, err := s.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "c", MessageID: "m", Fingerprint: fp("x"), Lease: time.Hour})
	if err != nil || !a.Acquired {
		t.Fatalf("Acquire = %+v, %v", a, err)
	}
	r, err := s.Inspect(ctx, "c", "m")
	if err != nil {
		t.Fatal(err)
	}
	if r.State != idemdriver.StateInProgress || r.Token != 1 || r.Attempt != 1 || r.Error != "" ||
		r.LeaseExpiresAt.Location() != time.UTC || r.ProcessedAt.Location() != time.UTC ||
		d(r.LeaseExpiresAt.Sub(serverNow)-time.Hour) > time.Minute {
		t.Errorf("Inspect of an in_progress record = %+v (server now %v)", r, serverNow)
	}
	if err := s.Release(ctx, &idemdriver.ReleaseParams{Consumer: "c", MessageID: "m", Token: a.Token, Error: "bad \x00 byte \xff", Terminal: true}); err != nil {
		t.Fatal(err)
	}
	r, err = s.Inspect(ctx, "c", "m")
	if err != nil {
		t.Fatal(err)
	}
	if r.State != idemdriver.StateFailed || r.Token != 2 || r.Attempt != 1 || r.Error != "bad \uFFFD byte \uFFFD" {
		t.Errorf("Inspect of a failed record = %+v; want failed, token 2, attempt 1, the error with U+FFFD", r)
	}

	// A transactional record is a completed record without a result; a
	// transactional claim of a lease record is a duplicate.
	c := b.consumer(t, "tx")
	if _, err := c.Process(ctx, idem.Message{ID: "t", Payload: []byte("p")}, b.effectHandler()); err != nil {
		t.Fatal(err)
	}
	r, err = s.Inspect(ctx, "tx", "t")
	if err != nil || r.State != idemdriver.StateCompleted || r.Token != 0 || r.Attempt != 1 || !r.LeaseExpiresAt.IsZero() {
		t.Errorf("Inspect of a transactional record = %+v, %v", r, err)
	}
	res, err := s.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "tx", MessageID: "t", Fingerprint: fp("p"), Lease: time.Minute})
	if err != nil || res.Acquired || res.State != idemdriver.StateCompleted || res.Result != nil || res.LeaseRemaining != 0 {
		t.Errorf("Acquire of a transactional record = %+v, %v; want completed, no result", res, err)
	}
}

func d(x time.Duration) time.Duration { return x.Abs() }

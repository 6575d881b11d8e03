package idemredis_test

import (
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
)

// TestGiveBackFenced: the give-back of an acquire whose WAIT fell short is
// fenced by the token that acquire issued: it changes nothing once
// another attempt took the record over, once the record was completed, or
// once the lease was released, and it removes nothing of the holder's.
func TestGiveBackFenced(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx, s := b.ctx, b.store
	acquire := func(id string) idemdriver.AcquireResult {
		t.Helper()
		res, err := s.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "c", MessageID: id, Fingerprint: []byte("f"), Lease: time.Minute, StepPrefix: "run:"})
		if err != nil || !res.Acquired {
			t.Fatalf("Acquire %s: %+v, %v", id, res, err)
		}
		return res
	}
	giveBack := func(id string, token int64) {
		t.Helper()
		if changed, err := s.GiveBack(ctx, "c", id, token, "run:"); err != nil || changed {
			t.Errorf("give-back of %s with token %d: changed %v, %v; want nothing changed", id, token, changed, err)
		}
	}

	// Taken over: token 1's give-back leaves token 2's lease and points.
	acquire("over")
	if err := s.ExpireLease(ctx, "c", "over"); err != nil {
		t.Fatal(err)
	}
	if res := acquire("over"); res.Token != 2 {
		t.Fatalf("takeover: token %d, want 2", res.Token)
	}
	giveBack("over", 1)
	if err := s.Renew(ctx, &idemdriver.RenewParams{Consumer: "c", MessageID: "over", Token: 2, Lease: time.Minute}); err != nil {
		t.Errorf("the holder after a stale give-back: %v", err)
	}
	if steps, err := s.Steps(ctx, "c", "over"); err != nil || len(steps) != 2 {
		t.Errorf("recovery points after a stale give-back: %+v, %v; want run:1 and run:2", steps, err)
	}

	// Completed by its token, then a give-back of that token.
	acquire("done")
	if err := s.Complete(ctx, &idemdriver.CompleteParams{Consumer: "c", MessageID: "done", Token: 1, Result: []byte("r")}); err != nil {
		t.Fatal(err)
	}
	giveBack("done", 1)

	// Released by its token.
	acquire("released")
	if err := s.Release(ctx, &idemdriver.ReleaseParams{Consumer: "c", MessageID: "released", Token: 1, Error: "e"}); err != nil {
		t.Fatal(err)
	}
	giveBack("released", 1)
	if n, err := s.CountRecords(ctx, "c"); err != nil || n != 3 {
		t.Errorf("records: %d, %v; want 3", n, err)
	}

	// The holder's own give-back does give back (the path of a short WAIT).
	acquire("own")
	if changed, err := s.GiveBack(ctx, "c", "own", 1, "run:"); err != nil || !changed {
		t.Errorf("own give-back: changed %v, %v; want changed", changed, err)
	}
	if n, err := s.CountRecords(ctx, "c"); err != nil || n != 3 {
		t.Errorf("records after the own give-back: %d, %v; want 3", n, err)
	}
}

package idempgxv5_test

import (
	"context"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idempgxv5"
)

// TestAcquireSeesReleaseCommittedAfterItsNow: an acquire statement reads
// now() when its transaction begins, before its snapshot; a release that
// began after that instant and committed before the snapshot ended the
// lease at a time later than the statement's now(). The statement's
// takeover (judged by now()) then does not take the record, but the
// lease had ended by the time the statement read it, so Acquire runs the
// statement again, and the next one takes it over. The test holds the
// first statement's now() back by running it in a transaction begun
// before the release.
func TestAcquireSeesReleaseCommittedAfterItsNow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, poolOpts{})
	p := &idemdriver.AcquireParams{Consumer: "c", MessageID: "m", Fingerprint: fp("x"), Lease: time.Minute}
	r, err := b.store.Acquire(ctx, p)
	if err != nil || !r.Acquired || r.Token != 1 {
		t.Fatalf("first Acquire = %+v, %v; want token 1", r, err)
	}
	first, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = first.Rollback(ctx) }()
	var began time.Time
	if err := first.QueryRow(ctx, `SELECT now()`).Scan(&began); err != nil {
		t.Fatal(err)
	}
	// The release's now() must be later than the first statement's.
	for {
		var now time.Time
		if err := b.pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
			t.Fatal(err)
		}
		if now.After(began) {
			break
		}
	}
	if err := b.store.Release(ctx, &idemdriver.ReleaseParams{Consumer: "c", MessageID: "m", Token: 1, Error: "retry"}); err != nil {
		t.Fatal(err)
	}
	r, err = idempgxv5.AcquireFirstOn(ctx, b.store, first, p)
	// The release took token 2; the takeover is token 3, attempt 2.
	if err != nil || !r.Acquired || r.Token != 3 || r.Attempt != 2 {
		t.Errorf("Acquire of a record released after its first statement's now() = %+v, %v; want acquired, token 3, attempt 2", r, err)
	}
	checkPool(t, b.pool)
}

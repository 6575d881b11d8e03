package idemtest

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// The RenewBatch cases check idemdriver.LeaseBatchRenewer: every lease of
// a batch judged as Renew judges it, results in the order given, fencing
// per lease, and a LeaseConsumer whose renewals ride in batches learning
// of a taken-over lease for that attempt only. They are skipped for a
// store without it.
func leaseRenewBatchCases() []leaseCase {
	return []leaseCase{
		{"PerLease", testRenewBatchPerLease},
		{"ConsumerTakenOver", testRenewBatchConsumer},
	}
}

// batchRenewer returns the store as an idemdriver.LeaseBatchRenewer, or
// skips the test.
func (b *leaseBundle) batchRenewer() idemdriver.LeaseBatchRenewer {
	b.t.Helper()
	r, ok := idemdriver.BatchRenewer(b.s.Store)
	if !ok {
		b.t.Skip("the store does not renew leases in batches (idemdriver.LeaseBatchRenewer)")
	}
	return r
}

// One RenewBatch over leases in every state: held (extended), taken over
// by another attempt (ErrLeaseLost for the old token, the new one
// extended in the same batch), expired with nobody taking over (still
// owned: extended), completed and released (ErrLeaseLost), never acquired
// (ErrLeaseLost) and invalid (ErrInvalidConfig). Each extended lease has
// more left than it had; the refused ones change nothing (the completed
// result stays, the released record is acquired by the next attempt, the
// new owner completes). An empty batch returns nothing, and one over
// idemdriver.MaxLeaseBatch is refused whole.
func testRenewBatchPerLease(t *testing.T, b *leaseBundle) {
	r := b.batchRenewer()
	consumer := b.name("c")
	s := b.s.Store
	m := func(id string) idem.Message { return idem.Message{ID: id, Payload: []byte("p")} }
	const short = time.Minute // the leases before the batch
	held := b.mustAcquire("held", consumer, m("held"), short, 1)
	old := b.mustAcquire("over", consumer, m("over"), short, 1)
	b.expire(consumer, "over")
	over := b.mustAcquire("over, taken over", consumer, m("over"), short, 2)
	expired := b.mustAcquire("expired", consumer, m("expired"), short, 1)
	b.expire(consumer, "expired")
	done := b.mustAcquire("done", consumer, m("done"), short, 1)
	if err := s.Complete(b.ctx, &idemdriver.CompleteParams{Consumer: consumer, MessageID: "done", Token: done.Token, Result: []byte("r-done")}); err != nil {
		t.Fatal(err)
	}
	rel := b.mustAcquire("released", consumer, m("released"), short, 1)
	if err := s.Release(b.ctx, &idemdriver.ReleaseParams{Consumer: consumer, MessageID: "released", Token: rel.Token, Error: "failed"}); err != nil {
		t.Fatal(err)
	}

	ps := []idemdriver.RenewParams{
		{Consumer: consumer, MessageID: "held", Token: held.Token, Lease: longLease},
		{Consumer: consumer, MessageID: "over", Token: old.Token, Lease: longLease},
		{Consumer: consumer, MessageID: "expired", Token: expired.Token, Lease: longLease},
		{Consumer: consumer, MessageID: "done", Token: done.Token, Lease: longLease},
		{Consumer: consumer, MessageID: "released", Token: rel.Token, Lease: longLease},
		{Consumer: consumer, MessageID: "unknown", Token: 1, Lease: longLease},
		{Consumer: consumer, MessageID: "held", Token: held.Token, Lease: 0},
		{Consumer: consumer, MessageID: "over", Token: over.Token, Lease: longLease},
	}
	errs, err := r.RenewBatch(b.ctx, ps)
	if err != nil {
		t.Fatalf("RenewBatch: %v", err)
	}
	if len(errs) != len(ps) {
		t.Fatalf("RenewBatch: %d errors for %d leases", len(errs), len(ps))
	}
	for i, want := range []error{nil, idem.ErrLeaseLost, nil, idem.ErrLeaseLost, idem.ErrLeaseLost, idem.ErrLeaseLost, idem.ErrInvalidConfig, nil} {
		switch {
		case want == nil && errs[i] != nil:
			t.Errorf("lease %d (%s, token %d): %v, want it extended", i, ps[i].MessageID, ps[i].Token, errs[i])
		case want != nil && !errors.Is(errs[i], want):
			t.Errorf("lease %d (%s, token %d): %v, want an error matching %v", i, ps[i].MessageID, ps[i].Token, errs[i], want)
		}
	}
	// The extended leases have more than short left.
	for _, id := range []string{"held", "expired", "over"} {
		res := b.acquire(id+" after the batch", consumer, m(id), short)
		b.wantNotAcquired(id+" after the batch", res, idemdriver.StateInProgress)
		if res.LeaseRemaining <= short {
			t.Errorf("%s after the batch: %v of lease left, want more than %v (renewed for %v)", id, res.LeaseRemaining, short, longLease)
		}
	}
	// The refused ones changed nothing.
	b.wantStaleRejected("over, the old token after the batch", consumer, "over", old.Token)
	res := b.acquire("done after the batch", consumer, m("done"), short)
	b.wantNotAcquired("done after the batch", res, idemdriver.StateCompleted)
	b.wantResult("done after the batch", res.Result, res.ContentType, idem.Result{Body: []byte("r-done")})
	b.mustAcquire("released after the batch", consumer, m("released"), short, 2)
	b.wantRecords("after the batch", consumer, 5) // unknown was not created
	if err := s.Complete(b.ctx, &idemdriver.CompleteParams{Consumer: consumer, MessageID: "over", Token: over.Token, Result: []byte("r-over")}); err != nil {
		t.Errorf("Complete by the new owner after the batch: %v", err)
	}

	if errs, err := r.RenewBatch(b.ctx, nil); err != nil || len(errs) != 0 {
		t.Errorf("RenewBatch of nothing: %v %v, want nothing", errs, err)
	}
	big := make([]idemdriver.RenewParams, idemdriver.MaxLeaseBatch+1)
	for i := range big {
		big[i] = idemdriver.RenewParams{Consumer: consumer, MessageID: "held", Token: held.Token, Lease: longLease}
	}
	if _, err := r.RenewBatch(b.ctx, big); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("RenewBatch of %d leases: %v, want an error matching ErrInvalidConfig", len(big), err)
	}
}

// A LeaseConsumer over the store holds 20 attempts whose renewals ride in
// one batch per tick; another process takes one of them over. That
// attempt learns it (its context ends with ErrLeaseLost, its Complete is
// refused), the 19 others are renewed past their first lease and
// complete, and the new owner's result is the one stored.
//
// The consumer runs in a testing/synctest bubble and the store's clock
// follows the bubble's (bubbleStore.followClock): a loaded machine that
// runs a renewal batch late cannot end the leases.
func testRenewBatchConsumer(t *testing.T, b *leaseBundle) {
	b.batchRenewer()
	const lease, n, over = 2 * time.Second, 20, 7
	w := newBubbleStore(t, b)
	synctest.Test(t, func(t *testing.T) {
		b := b.inBubble(t, w)
		w.followClock(b.name("c"))
		c := b.consumer("c", idem.Config{Lease: lease})
		consumer := c.Name()
		held := make([]*idem.Attempt, n)
		for i := range held {
			a, out, err := c.Acquire(b.ctx, idem.Message{ID: "m-" + string(rune('a'+i)), Payload: []byte("p")}, idem.AcquireOptions{})
			if a == nil {
				t.Fatalf("Acquire %d: %v %v", i, out, err)
			}
			held[i] = a
		}
		id := held[over].Message.ID
		var newOwner idemdriver.AcquireResult
		for try := 0; !newOwner.Acquired; try++ {
			if try == 5 {
				t.Fatalf("the takeover of %s: not acquired in 5 tries (a renewal landed after each expiry)", id)
			}
			b.expire(consumer, id)
			newOwner = b.acquire("the takeover", consumer, idem.Message{ID: id, Payload: []byte("p")}, longLease)
		}
		select {
		case <-held[over].Context().Done():
		case <-time.After(5 * lease):
			t.Fatalf("the taken-over attempt still holds its lease %v after the takeover", 5*lease)
		}
		if cause := context.Cause(held[over].Context()); !errors.Is(cause, idem.ErrLeaseLost) {
			t.Errorf("taken-over attempt: context cause %v, want ErrLeaseLost", cause)
		}
		// Past the first lease of the others: only renewals keep them.
		time.Sleep(lease + lease/3)
		for i, a := range held {
			if i == over {
				continue
			}
			if err := a.Context().Err(); err != nil {
				t.Errorf("attempt %d: context ended (%v) beside a taken-over one", i, context.Cause(a.Context()))
			}
			if _, err := a.Complete(b.ctx, idem.Result{Body: []byte("ok")}); err != nil {
				t.Errorf("Complete %d: %v", i, err)
			}
		}
		if _, err := held[over].Complete(b.ctx, idem.Result{Body: []byte("stale")}); !errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("Complete of the taken-over attempt: %v, want ErrLeaseLost", err)
		}
		if err := b.s.Store.Complete(b.ctx, &idemdriver.CompleteParams{Consumer: consumer, MessageID: id, Token: newOwner.Token, Result: []byte("new owner")}); err != nil {
			t.Fatalf("Complete by the new owner: %v", err)
		}
		res := b.acquire("after", consumer, idem.Message{ID: id, Payload: []byte("p")}, longLease)
		b.wantResult("the taken-over message", res.Result, res.ContentType, idem.Result{Body: []byte("new owner")})
	})
}

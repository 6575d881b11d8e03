package idemtest

import (
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

func leaseRemainingCases() []leaseCase {
	return []leaseCase{
		{"WithinEachLease", testLeaseRemainingWithinEachLease},
	}
}

// the remaining lease a caller who does not acquire is told follows every
// write that sets the lease, longer or shorter than the one before: the
// acquisition (an hour), a renewal to 10 minutes, a renewal to 2 hours, a
// release, and the takeover that follows it (30 minutes, after a record
// that was renewed). Each time it is within the lease just set (at most
// that lease, and no less than it minus the time passed since, with a
// second to spare); a released record is acquired at once, and a
// completed one reports no lease left.
func testLeaseRemainingWithinEachLease(t *testing.T, b *leaseBundle) {
	consumer := b.name("c")
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}
	s := b.s.Store
	var set time.Time
	within := func(what string, lease time.Duration) {
		t.Helper()
		res := b.acquire(what, consumer, msg, time.Minute)
		b.wantNotAcquired(what, res, idemdriver.StateInProgress)
		if lo := lease - time.Since(set) - time.Second; res.LeaseRemaining > lease || res.LeaseRemaining < lo {
			t.Errorf("%s: LeaseRemaining = %v, want between %v and %v", what, res.LeaseRemaining, lo, lease)
		}
	}
	renew := func(what string, token int64, lease time.Duration) {
		t.Helper()
		set = time.Now()
		if err := s.Renew(b.ctx, &idemdriver.RenewParams{Consumer: consumer, MessageID: msg.ID, Token: token, Lease: lease}); err != nil {
			t.Fatalf("%s: Renew: %v", what, err)
		}
	}

	set = time.Now()
	a1 := b.mustAcquire("attempt 1", consumer, msg, time.Hour, 1)
	within("after acquiring an hour", time.Hour)
	renew("renewed to 10 minutes", a1.Token, 10*time.Minute)
	within("after renewing to 10 minutes", 10*time.Minute)
	renew("renewed to 2 hours", a1.Token, 2*time.Hour)
	within("after renewing to 2 hours", 2*time.Hour)

	if err := s.Release(b.ctx, &idemdriver.ReleaseParams{Consumer: consumer, MessageID: msg.ID, Token: a1.Token, Error: "again"}); err != nil {
		t.Fatalf("Release: %v", err)
	}
	set = time.Now()
	a2 := b.mustAcquire("attempt 2, after the release of a renewed lease", consumer, msg, 30*time.Minute, 2)
	within("after taking over for 30 minutes", 30*time.Minute)

	if err := s.Complete(b.ctx, &idemdriver.CompleteParams{Consumer: consumer, MessageID: msg.ID, Token: a2.Token, Result: []byte("ok")}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	res := b.acquire("after Complete", consumer, msg, time.Minute)
	b.wantNotAcquired("after Complete", res, idemdriver.StateCompleted)
	if res.LeaseRemaining != 0 {
		t.Errorf("after Complete: LeaseRemaining = %v, want 0", res.LeaseRemaining)
	}
}

package idemtest

import (
	"errors"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// A store that inspects records reads one with its state, fencing token,
// attempt, fingerprint and last error, and an in-progress one with the
// end of its lease; a missing record is ErrNotFound and a name no record
// can have is refused.
func testOperateInspect(t *testing.T, b *leaseBundle) {
	in, ok := b.s.Store.(idemdriver.Inspector)
	if !ok {
		t.Skipf("store %T does not implement idemdriver.Inspector", b.s.Store)
	}
	c := b.name("c")
	b.poison(c, "failed", "boom: for good")
	b.complete(c, "done")
	held := b.mustAcquire("held", c, idem.Message{ID: "held", Payload: []byte("p:held")}, longLease, 1)
	inspect := func(id string) idemdriver.Record {
		t.Helper()
		r, err := in.Inspect(b.ctx, c, id)
		if err != nil {
			t.Fatalf("Inspect(%q): %v", id, err)
		}
		if r.Consumer != c || r.MessageID != id || len(r.Fingerprint) == 0 || r.ProcessedAt.IsZero() {
			t.Errorf("Inspect(%q) = %+v, want its consumer, ID, fingerprint and time", id, r)
		}
		return r
	}
	if r := inspect("failed"); r.State != idemdriver.StateFailed || r.Attempt != 1 || r.Error != "boom: for good" {
		t.Errorf("Inspect(failed) = %+v, want failed at attempt 1 with its error text", r)
	}
	if r := inspect("done"); r.State != idemdriver.StateCompleted {
		t.Errorf("Inspect(done) = %+v, want completed", r)
	}
	r := inspect("held")
	if r.State != idemdriver.StateInProgress || r.Token != held.Token || r.Attempt != 1 || !r.LeaseExpiresAt.After(r.ProcessedAt) {
		t.Errorf("Inspect(held) = %+v, want in progress under token %d, attempt 1, its lease ending after it began", r, held.Token)
	}
	if a, f := inspect("held").Fingerprint, inspect("failed").Fingerprint; string(a) == string(f) {
		t.Errorf("two payloads' records have one fingerprint %x", a)
	}
	if _, err := in.Inspect(b.ctx, c, "missing"); !errors.Is(err, idemdriver.ErrNotFound) {
		t.Errorf("Inspect of a missing record: %v, want ErrNotFound", err)
	}
	if _, err := in.Inspect(b.ctx, b.name("other"), "failed"); !errors.Is(err, idemdriver.ErrNotFound) {
		t.Errorf("Inspect of another consumer's ID: %v, want ErrNotFound", err)
	}
	if _, err := in.Inspect(b.ctx, c, ""); !errors.Is(err, idemdriver.ErrMissingMessageID) {
		t.Errorf("Inspect of an empty ID: %v, want ErrMissingMessageID", err)
	}
	if _, err := in.Inspect(b.ctx, "", "failed"); !errors.Is(err, idemdriver.ErrInvalidConsumerName) {
		t.Errorf("Inspect of an empty consumer: %v, want ErrInvalidConsumerName", err)
	}
}

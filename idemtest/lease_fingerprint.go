package idemtest

import (
	"bytes"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

func leaseFingerprintCases() []leaseCase {
	return []leaseCase{
		{"MismatchOnEveryPath", testLeaseMismatchEveryPath},
		{"AcceptMismatchAsDuplicate", testLeaseAcceptMismatch},
		{"StoredExactly", testLeaseFingerprintStoredExactly},
	}
}

// fingerprintPaths puts one message in each state a record can be in when
// a copy with another payload arrives, and returns them: completed, in
// progress (live lease), in progress with an expired lease, released after
// a retryable failure, and poison.
func (b *leaseBundle) fingerprintPaths(c *idem.LeaseConsumer) map[string]idem.Message {
	b.t.Helper()
	var calls atomic.Int64
	ms := map[string]idem.Message{}
	for _, name := range []string{"completed", "live", "expired", "released", "poison"} {
		ms[name] = idem.Message{ID: "m-" + name, Payload: []byte(`{"amount":200}`)}
	}
	b.process("completed: first delivery", c, ms["completed"], result(&calls, idem.Result{Body: []byte("R1")}), idem.Processed, nil)
	b.mustAcquire("live: attempt 1", c.Name(), ms["live"], longLease, 1)
	b.mustAcquire("expired: attempt 1", c.Name(), ms["expired"], longLease, 1)
	b.expire(c.Name(), ms["expired"].ID)
	b.process("released: failing attempt 1", c, ms["released"], failing(&calls, errBoom), idem.Failed, errBoom)
	out := b.process("poison: permanent failure", c, ms["poison"], failing(&calls, idem.Permanent(errBoom)), idem.Failed, idem.ErrPoison)
	b.wantPoison("poison: permanent failure", out, true)
	return ms
}

// a copy with another payload is a
// FingerprintMismatch whatever state the record is in, and never runs the
// handler; an expired or released record is not taken over by it (the
// original payload then is); the stored fingerprint survives completion.
func testLeaseMismatchEveryPath(t *testing.T, b *leaseBundle) {
	c := b.consumer("c", idem.Config{MaxAttempts: 3})
	ms := b.fingerprintPaths(c)
	var calls atomic.Int64
	h := result(&calls, idem.Result{Body: []byte("changed")})
	for _, name := range []string{"completed", "live", "expired", "released", "poison"} {
		changed := idem.Message{ID: ms[name].ID, Payload: []byte(`{"amount":500}`)}
		what := "another payload, record " + name
		out := b.process(what, c, changed, h, idem.FingerprintMismatch, idem.ErrFingerprintMismatch)
		if !out.DeadLetter() || !idem.IsPermanent(out.Err) || len(out.Result) != 0 {
			t.Errorf("%s: DeadLetter %v, IsPermanent %v, Result %q; want true, true and no result", what, out.DeadLetter(), idem.IsPermanent(out.Err), out.Result)
		}
		// Again, on a new consumer value: nothing cached.
		b.process(what+", new LeaseConsumer", b.consumer("c", idem.Config{MaxAttempts: 3}), changed, h, idem.FingerprintMismatch, idem.ErrFingerprintMismatch)
	}
	b.wantCalls("after the mismatches", &calls, 0)

	// The original payload still finds each record as it was.
	out := b.process("completed, original payload", c, ms["completed"], h, idem.Duplicate, nil)
	b.wantResult("completed, original payload", out.Result, out.ContentType, idem.Result{Body: []byte("R1")})
	b.process("live, original payload", c, ms["live"], h, idem.InProgress, idem.ErrInProgress)
	out = b.process("expired, original payload (takes over)", c, ms["expired"], h, idem.Processed, nil)
	b.wantAttempt("expired, original payload", out, 2)
	out = b.process("released, original payload (takes over)", c, ms["released"], h, idem.Processed, nil)
	b.wantAttempt("released, original payload", out, 2)
	out = b.process("poison, original payload", c, ms["poison"], h, idem.Failed, idem.ErrPoison)
	b.wantPoison("poison, original payload", out, true)
	b.wantCalls("after the original payloads", &calls, 2)
	b.wantRecords("after the mismatches", c.Name(), 5)
}

// Under AcceptMismatchAsDuplicate a copy with another payload is treated
// as the message it collides with, never run: a Duplicate with
// MismatchAccepted and the stored result when that one completed; InProgress
// (not acked) while it is in progress, live or expired, since it has not
// been processed yet; poison when it is poison.
func testLeaseAcceptMismatch(t *testing.T, b *leaseBundle) {
	c := b.consumer("c", idem.Config{MaxAttempts: 3, MismatchPolicy: idem.AcceptMismatchAsDuplicate})
	ms := b.fingerprintPaths(c)
	var calls atomic.Int64
	h := result(&calls, idem.Result{Body: []byte("changed")})
	changed := func(name string) idem.Message {
		return idem.Message{ID: ms[name].ID, Payload: []byte(`{"amount":500}`)}
	}

	out := b.process("completed, another payload", c, changed("completed"), h, idem.Duplicate, nil)
	if !out.MismatchAccepted {
		t.Errorf("completed, another payload: MismatchAccepted = false, want true")
	}
	b.wantResult("completed, another payload", out.Result, out.ContentType, idem.Result{Body: []byte("R1")})
	for _, name := range []string{"live", "expired", "released"} {
		out := b.process(name+", another payload", c, changed(name), h, idem.InProgress, idem.ErrInProgress)
		if out.MismatchAccepted {
			t.Errorf("%s, another payload: MismatchAccepted = true on an InProgress outcome", name)
		}
	}
	out = b.process("poison, another payload", c, changed("poison"), h, idem.Failed, idem.ErrPoison)
	b.wantPoison("poison, another payload", out, true)
	b.wantCalls("after the mismatches", &calls, 0)

	out = b.process("expired, original payload (takes over)", c, ms["expired"], h, idem.Processed, nil)
	b.wantAttempt("expired, original payload", out, 2)
	out = b.process("completed, original payload", c, ms["completed"], h, idem.Duplicate, nil)
	if out.MismatchAccepted {
		t.Errorf("completed, original payload: MismatchAccepted = true, want false")
	}
}

// Fingerprints are stored byte for byte, up to idem.MaxFingerprintLength,
// and returned by Acquire on every state.
func testLeaseFingerprintStoredExactly(t *testing.T, b *leaseBundle) {
	consumer := b.name("c")
	fp := make([]byte, idem.MaxFingerprintLength)
	for i := range fp {
		fp[i] = byte(255 - i*4) // 0xff 0x00 0xf7 ... 0x03
	}
	fp[1] = 0
	other := []byte("other")
	acquire := func(what string, f []byte) idemdriver.AcquireResult {
		t.Helper()
		res, err := b.s.Store.Acquire(b.ctx, &idemdriver.AcquireParams{Consumer: consumer, MessageID: "m-1", Fingerprint: f, Lease: longLease})
		if err != nil {
			t.Fatalf("%s: Store.Acquire: %v", what, err)
		}
		return res
	}
	a := acquire("first", fp)
	if !a.Acquired {
		t.Fatalf("first Acquire: not acquired (state %v)", a.State)
	}
	check := func(what string, state idemdriver.RecordState) {
		t.Helper()
		res := acquire(what, other)
		b.wantNotAcquired(what, res, state)
		if !bytes.Equal(res.Fingerprint, fp) {
			t.Errorf("%s: Fingerprint = %x, want %x", what, res.Fingerprint, fp)
		}
	}
	check("in progress", idemdriver.StateInProgress)
	b.expire(consumer, "m-1")
	check("expired (not taken over by another fingerprint)", idemdriver.StateInProgress)
	if err := b.s.Store.Complete(b.ctx, &idemdriver.CompleteParams{Consumer: consumer, MessageID: "m-1", Token: a.Token, Result: []byte("r")}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	check("completed", idemdriver.StateCompleted)
}

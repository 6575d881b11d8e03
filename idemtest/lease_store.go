package idemtest

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

func leasePurgeCases() []leaseCase {
	return []leaseCase{
		{"Window", testLeasePurgeWindow},
		{"ConsumerPurge", testLeaseConsumerPurge},
		{"RetainerPrimitives", testLeaseRetainerPrimitives},
	}
}

// The Store cases exercise the LeaseStore contract directly, without a
// LeaseConsumer in between.
func leaseStoreCases() []leaseCase {
	return []leaseCase{
		{"AcquireNew", testLeaseStoreAcquireNew},
		{"ConcurrentAcquire", testLeaseStoreConcurrentAcquire},
		{"ReleasedTokenLoses", testLeaseStoreReleasedTokenLoses},
		{"CompletedTokenLoses", testLeaseStoreCompletedTokenLoses},
		{"CompleteAfterExpiry", testLeaseStoreCompleteAfterExpiry},
		{"StepsStoredExactly", testLeaseStoreSteps},
		{"LeaseMustBePositive", testLeaseStoreLeasePositive},
		{"CancelledContext", testLeaseStoreCancelledContext},
		{"Validation", testLeaseStoreValidation},
	}
}

// Completed and failed records the consumer has outrun by the retention
// window are purged; in_progress records never are, whether their lease
// ran out or was released, however old they are. Records completed now
// (after attempts that started long ago) are inside the window.
func testLeasePurgeWindow(t *testing.T, b *leaseBundle) {
	c := b.consumer("c", idem.Config{MaxAttempts: 3})
	var calls atomic.Int64
	ok := result(&calls, idem.Result{Body: []byte("ok")})
	done := msgs("done-", 3)
	for _, m := range done {
		b.process("seeding "+m.ID, c, m, ok, idem.Processed, nil)
	}
	poison := idem.Message{ID: "poison", Payload: []byte("p")}
	b.process("seeding poison", c, poison, failing(&calls, idem.Permanent(errBoom)), idem.Failed, idem.ErrPoison)
	held := idem.Message{ID: "held", Payload: []byte("p")}
	b.mustAcquire("seeding held", c.Name(), held, longLease, 1)
	released := idem.Message{ID: "released", Payload: []byte("p")}
	b.process("seeding released", c, released, failing(&calls, errBoom), idem.Failed, errBoom)
	_ = c.Close()
	elapse(t, b.ctx, b.s.Store, b.s.Shift, c.Name(), 8*day)

	c = b.consumer("c", idem.Config{MaxAttempts: 3})
	fresh := idem.Message{ID: "fresh", Payload: []byte("p")}
	b.process("seeding fresh", c, fresh, ok, idem.Processed, nil)
	b.wantRecords("before the purge", c.Name(), 7)

	res, err := purgeWith(b.ctx, b.s.Store, c.Name(), window, 2, false, nil)
	if err != nil {
		t.Fatalf("Purge: %v", err)
	}
	if res.Deleted != 4 {
		t.Errorf("Purge: Deleted = %d, want 4 (3 completed and 1 failed record outrun by the window; in_progress records stay)", res.Deleted)
	}
	wantHorizonNear(t, "Purge", res.Horizon, time.Now().Add(-window))
	b.wantRecords("after the purge", c.Name(), 3)

	out := b.process("held 8 days ago, after the purge (its lease ran out: takes over)", c, held, ok, idem.Processed, nil)
	b.wantAttempt("held after the purge", out, 2)
	out = b.process("released after the purge (takes over)", c, released, ok, idem.Processed, nil)
	b.wantAttempt("released after the purge", out, 2)
	b.process("fresh after the purge", c, fresh, ok, idem.Duplicate, nil)
	out = b.process("a purged record, redelivered after the window", c, done[0], ok, idem.Processed, nil)
	b.wantAttempt("a purged record, redelivered after the window", out, 1)

	res, err = purgeWith(b.ctx, b.s.Store, c.Name(), window, 2, false, nil)
	if err != nil || res.Deleted != 0 {
		t.Errorf("second Purge: Deleted %d, err %v; want 0 and nil (records completed now, after attempts that began 8 days ago, are inside the window: Complete stamps the record time)", res.Deleted, err)
	}
	b.wantRecords("after the second purge", c.Name(), 4)
}

// LeaseConsumer.Purge uses the Config's window and batch size, and a
// downtime does not count.
func testLeaseConsumerPurge(t *testing.T, b *leaseBundle) {
	cfg := idem.Config{RetentionWindow: day, PurgeBatchSize: 2}
	c := b.consumer("c", cfg)
	var calls atomic.Int64
	ok := result(&calls, idem.Result{})
	old := msgs("old-", 3)
	for _, m := range old {
		b.process("seeding "+m.ID, c, m, ok, idem.Processed, nil)
	}
	_ = c.Close()
	downtime(t, b.ctx, b.s.Shift, c.Name(), 3*day)
	c = b.consumer("c", cfg)
	b.process("seeding new", c, idem.Message{ID: "new", Payload: []byte("p")}, ok, idem.Processed, nil)
	if res, err := c.Purge(b.ctx); err != nil || res.Deleted != 0 {
		t.Errorf("LeaseConsumer.Purge after 3 days down with a 1-day window: %+v, err %v; want nothing deleted", res, err)
	}
	for _, m := range old {
		b.process("a redelivery of before the downtime", c, m, ok, idem.Duplicate, nil)
	}
	inflight := idem.Message{ID: "inflight", Payload: []byte("p")}
	b.mustAcquire("seeding inflight", c.Name(), inflight, longLease, 1)
	_ = c.Close()
	elapse(t, b.ctx, b.s.Store, b.s.Shift, c.Name(), 2*day)
	c = b.consumer("c", cfg)
	res, err := c.Purge(b.ctx)
	if err != nil {
		t.Fatalf("LeaseConsumer.Purge: %v", err)
	}
	if res.Deleted != 4 || res.Batches < 2 || res.Batches > 3 {
		t.Errorf("LeaseConsumer.Purge with a 1-day window and batches of 2: Deleted %d in %d batches, want 4 in 2 (or 3)", res.Deleted, res.Batches)
	}
	b.wantRecords("after LeaseConsumer.Purge", c.Name(), 1)
}

// The Retainer primitives of a lease store, called directly.
func testLeaseRetainerPrimitives(t *testing.T, b *leaseBundle) {
	retainerCases(t, b.ctx, b.s.Store, b.name("direct"))
}

// A new message is acquired as attempt 1 with a positive token and no
// recovery points.
func testLeaseStoreAcquireNew(t *testing.T, b *leaseBundle) {
	consumer := b.name("c")
	a := b.mustAcquire("new message", consumer, idem.Message{ID: "m-1", Payload: []byte("p")}, longLease, 1)
	if len(a.Steps) != 0 {
		t.Errorf("new message: %d recovery points, want none", len(a.Steps))
	}
	b.wantRecords("after Acquire", consumer, 1)
}

// Concurrent Acquire calls: of 32 on a new message exactly one acquires;
// of 32 after the lease expired exactly one takes over, and likewise after
// a release. The others see the record: in_progress, its attempt count,
// its fingerprint and a live LeaseRemaining within the lease.
func testLeaseStoreConcurrentAcquire(t *testing.T, b *leaseBundle) {
	consumer := b.name("c")
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}
	round := func(what string, attempt int) idemdriver.AcquireResult {
		t.Helper()
		res := make([]idemdriver.AcquireResult, concurrency)
		errs := make([]error, concurrency)
		race(concurrency, func(i int) {
			res[i], errs[i] = b.s.Store.Acquire(b.ctx, &idemdriver.AcquireParams{Consumer: consumer, MessageID: msg.ID, Fingerprint: fingerprint(msg.Payload), Lease: longLease})
		})
		var won idemdriver.AcquireResult
		acquired := 0
		for i, r := range res {
			switch {
			case errs[i] != nil:
				t.Errorf("%s: Acquire %d: %v", what, i, errs[i])
			case r.Acquired:
				acquired++
				won = r
				if r.Attempt != attempt {
					t.Errorf("%s: the winner's Attempt = %d, want %d", what, r.Attempt, attempt)
				}
			default:
				if r.State != idemdriver.StateInProgress || r.Attempt != attempt || r.LeaseRemaining <= 0 || r.LeaseRemaining > longLease {
					t.Errorf("%s: a loser saw state %v, attempt %d, LeaseRemaining %v; want in_progress, %d, in (0, %v]",
						what, r.State, r.Attempt, r.LeaseRemaining, attempt, longLease)
				}
				if string(r.Fingerprint) != string(fingerprint(msg.Payload)) {
					t.Errorf("%s: a loser saw fingerprint %x, want %x", what, r.Fingerprint, fingerprint(msg.Payload))
				}
			}
		}
		if acquired != 1 {
			t.Fatalf("%s: %d of %d concurrent Acquire calls acquired, want exactly 1", what, acquired, concurrency)
		}
		return won
	}
	a1 := round("new message", 1)
	b.expire(consumer, msg.ID)
	a2 := round("after the lease expired", 2)
	if err := b.s.Store.Release(b.ctx, &idemdriver.ReleaseParams{Consumer: consumer, MessageID: msg.ID, Token: a2.Token, Error: "retry"}); err != nil {
		t.Fatalf("Release: %v", err)
	}
	a3 := round("after a release", 3)
	if !(a1.Token < a2.Token && a2.Token < a3.Token) {
		t.Errorf("tokens of the three winners = %d, %d, %d; want strictly increasing", a1.Token, a2.Token, a3.Token)
	}
	b.wantRecords("after the concurrent acquires", consumer, 1)
}

// After Release, the released token owns nothing: its Renew, SaveStep,
// Complete and a second Release fail with ErrLeaseLost. The next Acquire
// takes over at once (a release ends the lease) with the recovery points.
// A terminal Release leaves a failed record with the error text, byte for
// byte, and the attempt count.
func testLeaseStoreReleasedTokenLoses(t *testing.T, b *leaseBundle) {
	consumer := b.name("c")
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}
	s := b.s.Store
	a1 := b.mustAcquire("attempt 1", consumer, msg, longLease, 1)
	if err := s.SaveStep(b.ctx, &idemdriver.StepParams{Consumer: consumer, MessageID: msg.ID, Token: a1.Token, Step: "s", Result: []byte("v")}); err != nil {
		t.Fatalf("SaveStep: %v", err)
	}
	if err := s.Release(b.ctx, &idemdriver.ReleaseParams{Consumer: consumer, MessageID: msg.ID, Token: a1.Token, Error: "attempt 1 failed"}); err != nil {
		t.Fatalf("Release: %v", err)
	}
	b.wantStaleRejected("attempt 1 after its Release", consumer, msg.ID, a1.Token)

	a2 := b.mustAcquire("attempt 2, right after the release", consumer, msg, longLease, 2)
	if a2.Token <= a1.Token {
		t.Errorf("attempt 2: token %d, want more than %d", a2.Token, a1.Token)
	}
	b.wantSteps("attempt 2", a2.Steps, map[string][]byte{"s": []byte("v")})
	if err := s.Release(b.ctx, &idemdriver.ReleaseParams{Consumer: consumer, MessageID: msg.ID, Token: a2.Token, Error: errText, Terminal: true}); err != nil {
		t.Fatalf("terminal Release: %v", err)
	}
	b.wantStaleRejected("attempt 2 after its terminal Release", consumer, msg.ID, a2.Token)
	res := b.acquire("after the terminal release", consumer, msg, longLease)
	b.wantNotAcquired("after the terminal release", res, idemdriver.StateFailed)
	if res.Error != errText || res.Attempt != 2 {
		t.Errorf("failed record: Error %q, Attempt %d; want %q and 2", res.Error, res.Attempt, errText)
	}
	b.wantRecords("after the releases", consumer, 1)
}

// After Complete, the token owns nothing either: a second Complete (with
// another result), Renew, SaveStep and Release fail with ErrLeaseLost and
// the first result stays.
func testLeaseStoreCompletedTokenLoses(t *testing.T, b *leaseBundle) {
	consumer := b.name("c")
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}
	a := b.mustAcquire("attempt 1", consumer, msg, longLease, 1)
	want := idem.Result{Body: []byte("first"), ContentType: "application/json"}
	if err := b.s.Store.Complete(b.ctx, &idemdriver.CompleteParams{Consumer: consumer, MessageID: msg.ID, Token: a.Token, Result: want.Body, ContentType: want.ContentType}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	b.wantStaleRejected("after Complete", consumer, msg.ID, a.Token)
	res := b.acquire("after completion", consumer, msg, longLease)
	b.wantNotAcquired("after completion", res, idemdriver.StateCompleted)
	b.wantResult("after completion", res.Result, res.ContentType, want)
}

// Field case C08, the late finisher: an attempt whose lease expired while
// nobody took over still owns the record, so it may save a step and
// complete (its work is not thrown away).
func testLeaseStoreCompleteAfterExpiry(t *testing.T, b *leaseBundle) {
	consumer := b.name("c")
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}
	s := b.s.Store
	a := b.mustAcquire("attempt 1", consumer, msg, longLease, 1)
	b.expire(consumer, msg.ID)
	if err := s.SaveStep(b.ctx, &idemdriver.StepParams{Consumer: consumer, MessageID: msg.ID, Token: a.Token, Step: "s", Result: []byte("v")}); err != nil {
		t.Errorf("SaveStep after the lease expired, nobody having taken over: %v, want nil", err)
	}
	want := idem.Result{Body: []byte("late"), ContentType: "text/plain"}
	if err := s.Complete(b.ctx, &idemdriver.CompleteParams{Consumer: consumer, MessageID: msg.ID, Token: a.Token, Result: want.Body, ContentType: want.ContentType}); err != nil {
		t.Fatalf("Complete after the lease expired, nobody having taken over: %v, want nil", err)
	}
	res := b.acquire("after the late completion", consumer, msg, longLease)
	b.wantNotAcquired("after the late completion", res, idemdriver.StateCompleted)
	b.wantResult("after the late completion", res.Result, res.ContentType, want)
}

// Recovery points are stored byte for byte under names of 1 to 255 bytes;
// an empty result still marks its step done; saving a step again keeps
// the first result.
func testLeaseStoreSteps(t *testing.T, b *leaseBundle) {
	consumer := b.name("c")
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}
	s := b.s.Store
	a := b.mustAcquire("attempt 1", consumer, msg, longLease, 1)
	want := map[string][]byte{
		"charge":                 []byte("ch_1"),
		"empty":                  {},
		"nil":                    {},
		"every byte value":       everyByte(),
		strings.Repeat("n", 255): []byte("longest name"),
		"\u00e9t\u00e4pe \"x\"":  []byte("unicode name"),
		"Charge":                 []byte("names are case-sensitive"),
	}
	save := func(name string, res []byte) {
		t.Helper()
		if err := s.SaveStep(b.ctx, &idemdriver.StepParams{Consumer: consumer, MessageID: msg.ID, Token: a.Token, Step: name, Result: res}); err != nil {
			t.Errorf("SaveStep(%q): %v", name, err)
		}
	}
	for name, res := range want {
		if name == "nil" {
			res = nil
		}
		save(name, res)
	}
	save("charge", []byte("ch_2")) // keeps ch_1
	if err := s.Release(b.ctx, &idemdriver.ReleaseParams{Consumer: consumer, MessageID: msg.ID, Token: a.Token, Error: "retry"}); err != nil {
		t.Fatalf("Release: %v", err)
	}
	a2 := b.mustAcquire("attempt 2", consumer, msg, longLease, 2)
	b.wantSteps("attempt 2", a2.Steps, want)
	for _, name := range []string{"empty", "nil"} {
		if _, ok := a2.Steps[name]; !ok {
			t.Errorf("attempt 2: step %q with an empty result is missing, want it present (done)", name)
		}
	}
}

// A lease that is not positive is refused (field case C08: zero must never
// mean "no expiry"), and nothing is recorded.
func testLeaseStoreLeasePositive(t *testing.T, b *leaseBundle) {
	consumer := b.name("c")
	for _, lease := range []time.Duration{0, -time.Millisecond} {
		_, err := b.s.Store.Acquire(b.ctx, &idemdriver.AcquireParams{Consumer: consumer, MessageID: "m-1", Fingerprint: []byte("fp"), Lease: lease})
		if !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("Acquire with lease %v: err = %v, want an error matching ErrInvalidConfig", lease, err)
		}
	}
	b.wantRecords("after the refused acquires", consumer, 0)
}

// Calls with an ended context fail with its error and change nothing.
func testLeaseStoreCancelledContext(t *testing.T, b *leaseBundle) {
	consumer := b.name("c")
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}
	s := b.s.Store
	ctx, cancel := context.WithCancel(b.ctx)
	cancel()
	if _, err := s.Acquire(ctx, &idemdriver.AcquireParams{Consumer: consumer, MessageID: msg.ID, Fingerprint: fingerprint(msg.Payload), Lease: longLease}); !errors.Is(err, context.Canceled) {
		t.Errorf("Acquire with a cancelled context: err = %v, want an error matching context.Canceled", err)
	}
	b.wantRecords("after the cancelled Acquire", consumer, 0)

	a := b.mustAcquire("attempt 1", consumer, msg, longLease, 1)
	for _, op := range []struct {
		name string
		call func() error
	}{
		{"Renew", func() error {
			return s.Renew(ctx, &idemdriver.RenewParams{Consumer: consumer, MessageID: msg.ID, Token: a.Token, Lease: longLease})
		}},
		{"SaveStep", func() error {
			return s.SaveStep(ctx, &idemdriver.StepParams{Consumer: consumer, MessageID: msg.ID, Token: a.Token, Step: "s", Result: []byte("v")})
		}},
		{"Complete", func() error {
			return s.Complete(ctx, &idemdriver.CompleteParams{Consumer: consumer, MessageID: msg.ID, Token: a.Token, Result: []byte("r")})
		}},
		{"Release", func() error {
			return s.Release(ctx, &idemdriver.ReleaseParams{Consumer: consumer, MessageID: msg.ID, Token: a.Token, Error: "e", Terminal: true})
		}},
	} {
		if err := op.call(); !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a cancelled context: err = %v, want an error matching context.Canceled", op.name, err)
		}
	}
	res := b.acquire("after the cancelled calls", consumer, msg, longLease)
	b.wantNotAcquired("after the cancelled calls (still attempt 1's live lease)", res, idemdriver.StateInProgress)
	if res.Attempt != 1 {
		t.Errorf("after the cancelled calls: Attempt = %d, want 1", res.Attempt)
	}
	b.expire(consumer, msg.ID)
	a2 := b.mustAcquire("attempt 2", consumer, msg, longLease, 2)
	b.wantSteps("attempt 2 (the cancelled SaveStep saved nothing)", a2.Steps, nil)
	if err := s.Complete(b.ctx, &idemdriver.CompleteParams{Consumer: consumer, MessageID: msg.ID, Token: a2.Token, Result: []byte("r")}); err != nil {
		t.Errorf("Complete of attempt 2: %v, want nil", err)
	}
}

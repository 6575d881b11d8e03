package idemtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

func leaseFailureCases() []leaseCase {
	return []leaseCase{
		{"ReleaseKeepsRecoveryPoints", testLeaseReleaseKeepsSteps},
		{"PoisonAfterMaxAttempts", testLeasePoisonAfterMaxAttempts},
		{"PermanentPoisonsAtOnce", testLeasePermanent},
		{"CrashLoopPoisons", testLeaseCrashLoop},
	}
}

// A retryable handler error releases the lease: Failed with the handler's
// error, not poison; the record stays with its attempt count and recovery
// points, so the next delivery runs as attempt 2, gets the steps attempt 1
// completed without running them again, and derives the same external
// idempotency keys (Attempt.Key = idem.DeriveKey).
func testLeaseReleaseKeepsSteps(t *testing.T, b *leaseBundle) {
	c := b.consumer("c", idem.Config{})
	msg := idem.Message{ID: "pay-1", Payload: []byte(`{"amount":100}`)}
	steps := []struct {
		name string
		res  []byte
	}{
		{"charge", []byte("ch_1")},
		{"empty result", nil},
		{"every byte value", everyByte()},
		{"n\u00e4me/with:separators " + strings.Repeat("x", 200), []byte("long name")},
	}
	stepCalls := make([]atomic.Int64, len(steps))
	var keys []string
	var runs atomic.Int64
	h := func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
		runs.Add(1)
		keys = append(keys, a.Key("charge"))
		for i, s := range steps {
			if a.Number > 1 && !a.Completed(s.name) {
				t.Errorf("attempt %d: Completed(%q) = false, want true (attempt 1 completed it)", a.Number, s.name)
			}
			got, err := a.Step(ctx, s.name, func(context.Context) ([]byte, error) {
				stepCalls[i].Add(1)
				return s.res, nil
			})
			if err != nil {
				return idem.Result{}, fmt.Errorf("step %q: %w", s.name, err)
			}
			if !bytes.Equal(got, s.res) {
				t.Errorf("attempt %d: step %q returned %s", a.Number, s.name, diffBytes(got, s.res))
			}
		}
		if a.Number == 1 {
			for _, name := range []string{"", strings.Repeat("s", 256)} {
				if _, err := a.Step(ctx, name, func(context.Context) ([]byte, error) { return nil, nil }); !errors.Is(err, idem.ErrInvalidConfig) {
					t.Errorf("Step with a %d-byte name: err = %v, want an error matching ErrInvalidConfig", len(name), err)
				}
			}
			return idem.Result{}, errBoom
		}
		return idem.Result{Body: []byte("receipt"), ContentType: "text/plain"}, nil
	}

	out := b.process("attempt 1, failing after its steps", c, msg, h, idem.Failed, errBoom)
	b.wantPoison("attempt 1", out, false)
	b.wantAttempt("attempt 1", out, 1)
	if errors.Is(out.Err, idem.ErrLeaseLost) || errors.Is(out.Err, idem.ErrStore) {
		t.Errorf("attempt 1: err = %v, want the handler's error only (the release succeeded)", out.Err)
	}
	b.wantRecords("after the released attempt", c.Name(), 1)

	out = b.process("attempt 2", c, msg, h, idem.Processed, nil)
	b.wantAttempt("attempt 2", out, 2)
	for i, s := range steps {
		if n := stepCalls[i].Load(); n != 1 {
			t.Errorf("step %q ran %d times over two attempts, want 1 (a recovery point)", s.name, n)
		}
	}
	wantKey := idem.DeriveKey(c.Name(), msg.ID, "charge")
	if len(keys) != 2 || keys[0] != wantKey || keys[1] != wantKey {
		t.Errorf("Attempt.Key(%q) on attempts 1 and 2 = %q, want %q both times", "charge", keys, wantKey)
	}
	b.process("redelivery", c, msg, h, idem.Duplicate, nil)
	if n := runs.Load(); n != 2 {
		t.Errorf("handler runs = %d, want 2", n)
	}
	b.wantRecords("after completion", c.Name(), 1)
}

// With MaxAttempts 3, attempts 1 and 2 fail retryably and the failure of
// attempt 3 poisons the message: Failed, Poison, ErrPoison (and the
// handler's error), DeadLetter. The terminal record keeps the error: a
// fourth delivery, even on a new LeaseConsumer, does not run the handler
// and is poison with the stored error text.
func testLeasePoisonAfterMaxAttempts(t *testing.T, b *leaseBundle) {
	c := b.consumer("c", idem.Config{MaxAttempts: 3})
	msg := idem.Message{ID: "m-poison", Payload: []byte("p")}
	var calls atomic.Int64
	h := failing(&calls, errBoom)
	for n := 1; n <= 3; n++ {
		what := fmt.Sprintf("attempt %d of 3", n)
		out := b.process(what, c, msg, h, idem.Failed, errBoom)
		b.wantPoison(what, out, n == 3)
		b.wantAttempt(what, out, n)
	}
	for _, cc := range []*idem.LeaseConsumer{c, b.consumer("c", idem.Config{MaxAttempts: 3})} {
		out := b.process("delivery after poison", cc, msg, h, idem.Failed, idem.ErrPoison)
		b.wantPoison("delivery after poison", out, true)
		b.wantAttempt("delivery after poison", out, 3)
		if out.Err == nil || !strings.Contains(out.Err.Error(), errBoom.Error()) {
			t.Errorf("delivery after poison: err = %v, want it to carry the stored error %q", out.Err, errBoom.Error())
		}
	}
	b.wantCalls("after poison", &calls, 3)
	res := b.acquire("Store.Acquire of the poison record", c.Name(), msg, longLease)
	b.wantNotAcquired("Store.Acquire of the poison record", res, idemdriver.StateFailed)
	if res.Attempt != 3 || res.Error != errBoom.Error() {
		t.Errorf("poison record: Attempt %d, Error %q; want 3 and %q", res.Attempt, res.Error, errBoom.Error())
	}
	b.wantRecords("after poison", c.Name(), 1)
}

// errDeclined is a failure the custom Retryable classifies as permanent.
var errDeclined = errors.New("idemtest: payment declined")

// A Permanent error poisons on attempt 1, as does an error the Config's
// Retryable rejects, and any failure when MaxAttempts is 1 (a panic too).
func testLeasePermanent(t *testing.T, b *leaseBundle) {
	c := b.consumer("c", idem.Config{MaxAttempts: 3})
	var calls atomic.Int64
	msg := idem.Message{ID: "m-permanent", Payload: []byte("p")}
	out := b.process("Permanent error on attempt 1", c, msg, failing(&calls, idem.Permanent(errBoom)), idem.Failed, idem.ErrPoison)
	b.wantPoison("Permanent error on attempt 1", out, true)
	b.wantAttempt("Permanent error on attempt 1", out, 1)
	if !errors.Is(out.Err, idem.ErrPermanent) || !errors.Is(out.Err, errBoom) {
		t.Errorf("Permanent error: err = %v, want it to match ErrPermanent and the handler's error", out.Err)
	}
	out = b.process("redelivery of the permanently failed message", c, msg, failing(&calls, errBoom), idem.Failed, idem.ErrPoison)
	b.wantPoison("redelivery of the permanently failed message", out, true)
	b.wantCalls("after the permanent failure", &calls, 1)

	classify := b.consumer("classify", idem.Config{MaxAttempts: 3, Retryable: func(err error) bool { return !errors.Is(err, errDeclined) }})
	out = b.process("error the Retryable rejects", classify, msg, failing(&calls, fmt.Errorf("charge: %w", errDeclined)), idem.Failed, idem.ErrPoison)
	b.wantPoison("error the Retryable rejects", out, true)
	out = b.process("error the Retryable accepts", classify, idem.Message{ID: "m-other", Payload: []byte("p")}, failing(&calls, errBoom), idem.Failed, errBoom)
	b.wantPoison("error the Retryable accepts", out, false)

	once := b.consumer("once", idem.Config{MaxAttempts: 1})
	out = b.process("panic with MaxAttempts 1", once, msg, func(context.Context, *idem.Attempt) (idem.Result, error) {
		calls.Add(1)
		panic("boom")
	}, idem.Failed, idem.ErrPoison)
	b.wantPoison("panic with MaxAttempts 1", out, true)
	if !errors.Is(out.Err, idem.ErrHandlerPanic) {
		t.Errorf("panic with MaxAttempts 1: err = %v, want it to match ErrHandlerPanic too", out.Err)
	}
}

// A crash loop: attempts that acquire and then die (their leases expire,
// nothing is released) still count. With MaxAttempts 3, a third attempt
// after two crashes runs; after three crashes the next delivery poisons the
// message without running the handler, and so does every later one.
func testLeaseCrashLoop(t *testing.T, b *leaseBundle) {
	c := b.consumer("c", idem.Config{MaxAttempts: 3})
	var calls atomic.Int64
	h := result(&calls, idem.Result{Body: []byte("ok")})

	survivor := idem.Message{ID: "m-two-crashes", Payload: []byte("p")}
	for n := 1; n <= 2; n++ {
		b.mustAcquire(fmt.Sprintf("crashing attempt %d", n), c.Name(), survivor, longLease, n)
		b.expire(c.Name(), survivor.ID)
	}
	out := b.process("attempt 3 after two crashes", c, survivor, h, idem.Processed, nil)
	b.wantAttempt("attempt 3 after two crashes", out, 3)
	b.wantCalls("attempt 3 after two crashes", &calls, 1)

	msg := idem.Message{ID: "m-crash-loop", Payload: []byte("p")}
	for n := 1; n <= 3; n++ {
		b.mustAcquire(fmt.Sprintf("crashing attempt %d", n), c.Name(), msg, longLease, n)
		b.expire(c.Name(), msg.ID)
	}
	out = b.process("delivery after 3 crashes", c, msg, h, idem.Failed, idem.ErrPoison)
	b.wantPoison("delivery after 3 crashes", out, true)
	out = b.process("later delivery", c, msg, h, idem.Failed, idem.ErrPoison)
	b.wantPoison("later delivery", out, true)
	b.wantCalls("after the crash loop (the handler must not run again)", &calls, 1)
	res := b.acquire("Store.Acquire after the crash loop", c.Name(), msg, longLease)
	b.wantNotAcquired("Store.Acquire after the crash loop", res, idemdriver.StateFailed)
	b.wantRecords("after the crash loop", c.Name(), 2)
}

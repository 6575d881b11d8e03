package idemtest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

func leaseExpiryCases() []leaseCase {
	return []leaseCase{
		{"TakeoverFencesStaleOwner", testLeaseTakeoverFences},
		{"StaleHandlerLoses", testLeaseStaleHandlerLoses},
		{"RenewalKeepsClaim", testLeaseRenewalKeepsClaim},
		{"LostLeaseCancelsHandler", testLeaseLostCancelsHandler},
		{"TimeUnits", testLeaseTimeUnits},
		{"OneMillisecondLease", testLeaseOneMillisecond},
		{"TokensIncrease", testLeaseTokensIncrease},
	}
}

// after the lease of attempt 1 expires, the
// next Acquire takes over as attempt 2 with a higher token and the
// recovery points saved so far. The stale owner's Renew, SaveStep,
// Complete and Release are rejected with ErrLeaseLost and change nothing:
// not the steps, not the state, not the result.
func testLeaseTakeoverFences(t *testing.T, b *leaseBundle) {
	consumer := b.name("c")
	msg := idem.Message{ID: "m-1", Payload: []byte(`{"amount":200}`)}
	s := b.s.Store

	a1 := b.mustAcquire("attempt 1", consumer, msg, longLease, 1)
	if err := s.SaveStep(b.ctx, &idemdriver.StepParams{Consumer: consumer, MessageID: msg.ID, Token: a1.Token, Step: "charge", Result: []byte("ch_1")}); err != nil {
		t.Fatalf("attempt 1: SaveStep: %v", err)
	}
	steps := map[string][]byte{"charge": []byte("ch_1")}

	b.expire(consumer, msg.ID)
	a2 := b.mustAcquire("attempt 2, after the lease of attempt 1 expired", consumer, msg, longLease, 2)
	if a2.Token <= a1.Token {
		t.Errorf("takeover: token %d, want more than the stale owner's %d", a2.Token, a1.Token)
	}
	b.wantSteps("attempt 2", a2.Steps, steps)
	b.wantStaleRejected("attempt 1 after the takeover", consumer, msg.ID, a1.Token)

	// The stale owner's writes changed nothing: attempt 2 still owns a live
	// in_progress record, and attempt 3 sees only attempt 1's real step.
	res := b.acquire("while attempt 2 holds the lease", consumer, msg, longLease)
	b.wantNotAcquired("while attempt 2 holds the lease (after the stale owner's writes)", res, idemdriver.StateInProgress)
	b.expire(consumer, msg.ID)
	a3 := b.mustAcquire("attempt 3", consumer, msg, longLease, 3)
	if a3.Token <= a2.Token {
		t.Errorf("second takeover: token %d, want more than %d", a3.Token, a2.Token)
	}
	b.wantSteps("attempt 3 (no step from a stale owner)", a3.Steps, steps)
	b.wantStaleRejected("attempt 1 after two takeovers", consumer, msg.ID, a1.Token)
	b.wantStaleRejected("attempt 2 after the takeover", consumer, msg.ID, a2.Token)

	want := idem.Result{Body: []byte("receipt of attempt 3"), ContentType: "text/plain"}
	if err := s.Complete(b.ctx, &idemdriver.CompleteParams{Consumer: consumer, MessageID: msg.ID, Token: a3.Token, Result: want.Body, ContentType: want.ContentType}); err != nil {
		t.Fatalf("attempt 3: Complete: %v", err)
	}
	b.wantStaleRejected("attempt 2 after attempt 3 completed", consumer, msg.ID, a2.Token)
	res = b.acquire("after completion", consumer, msg, longLease)
	b.wantNotAcquired("after completion", res, idemdriver.StateCompleted)
	b.wantResult("after completion", res.Result, res.ContentType, want)
	if res.Attempt != 3 {
		t.Errorf("after completion: Attempt = %d, want 3", res.Attempt)
	}

	c := b.consumer("c", idem.Config{})
	var calls atomic.Int64
	out := b.process("redelivery after completion", c, msg, result(&calls, idem.Result{Body: []byte("again")}), idem.Duplicate, nil)
	b.wantResult("redelivery after completion", out.Result, out.ContentType, want)
	b.wantCalls("redelivery after completion", &calls, 0)
	b.wantRecords("after the takeovers", consumer, 1)
}

// attempt 1's handler is still
// running when its lease expires; attempt 2 takes over and completes; when
// attempt 1's handler then returns, its Process is Failed with ErrLeaseLost
// (not acked, not poison) and the stored result stays attempt 2's.
func testLeaseStaleHandlerLoses(t *testing.T, b *leaseBundle) {
	c := b.consumer("c", idem.Config{})
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}
	var runs atomic.Int64
	var staleToken, freshToken atomic.Int64
	entered, release := make(chan struct{}), make(chan struct{})
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	done := b.goProcess(c, msg, func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
		runs.Add(1)
		staleToken.Store(a.Token)
		close(entered)
		hold(ctx, release)
		return idem.Result{Body: []byte("stale result")}, nil
	})
	if !waitFor(t, entered, "attempt 1's handler starting") {
		return
	}
	b.expire(c.Name(), msg.ID)
	fresh := idem.Result{Body: []byte("fresh result"), ContentType: "text/plain"}
	out := b.process("takeover while attempt 1 still runs", c, msg, func(_ context.Context, a *idem.Attempt) (idem.Result, error) {
		runs.Add(1)
		freshToken.Store(a.Token)
		return fresh, nil
	}, idem.Processed, nil)
	b.wantAttempt("takeover", out, 2)
	close(release)

	r, ok := await(t, done, "attempt 1's Process after its handler returned")
	if !ok {
		return
	}
	b.wantOutcome("attempt 1, finishing after the takeover completed", msg.ID, r.out, r.err, idem.Failed, idem.ErrLeaseLost)
	b.wantPoison("attempt 1, finishing after the takeover completed", r.out, false)
	b.wantAttempt("attempt 1", r.out, 1)
	if freshToken.Load() <= staleToken.Load() {
		t.Errorf("attempt 2 token %d, want more than attempt 1's %d", freshToken.Load(), staleToken.Load())
	}
	var calls atomic.Int64
	out = b.process("redelivery", c, msg, result(&calls, idem.Result{}), idem.Duplicate, nil)
	b.wantResult("redelivery: the stored result is the new owner's", out.Result, out.ContentType, fresh)
	if n := runs.Load(); n != 2 {
		t.Errorf("handler runs = %d, want 2 (attempt 1 and the takeover)", n)
	}
	b.wantRecords("after the takeover", c.Name(), 1)
}

// renewalLease is the lease of the renewal case: three renewals (every
// Lease/3) take it.
const renewalLease = 2 * time.Second

// A handler that runs for longer than its lease keeps the message: the
// LeaseConsumer renews every Lease/3, and a copy delivered meanwhile (also
// after the first lease would have run out) is InProgress, never a
// takeover. The handler then completes: Processed, one run.
//
// The consumers run in a testing/synctest bubble and the store's clock
// follows the bubble's (bubbleStore.followClock): a loaded machine that
// runs a renewal late cannot end the lease, while a store whose Renew
// does not extend it lets the copy after the third renewal take over.
func testLeaseRenewalKeepsClaim(t *testing.T, b *leaseBundle) {
	w := newBubbleStore(t, b)
	synctest.Test(t, func(t *testing.T) {
		b := b.inBubble(t, w)
		w.followClock(b.name("c"))
		spy := newSpyStore(w, nil)
		c := b.consumerOn(spy, "c", idem.Config{Lease: renewalLease})
		other := b.consumer("c", idem.Config{Lease: renewalLease})
		msg := idem.Message{ID: "m-long", Payload: []byte("p")}
		var runs atomic.Int64
		tokens := make(chan int64, 1)
		release := make(chan struct{})
		defer func() {
			select {
			case <-release:
			default:
				close(release)
			}
		}()
		want := idem.Result{Body: []byte("long result")}
		done := b.goProcess(c, msg, func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
			runs.Add(1)
			tokens <- a.Token
			if !hold(ctx, release) {
				return idem.Result{}, fmt.Errorf("handler context ended while waiting: %w", context.Cause(ctx))
			}
			return want, nil
		})
		token, ok := await(t, tokens, "the long handler starting")
		if !ok {
			return
		}
		var copies atomic.Int64
		for k := 1; k <= 3; k++ {
			if !spy.waitRenewals(t, token, k) {
				break
			}
			what := fmt.Sprintf("copy delivered after renewal %d", k)
			out := b.process(what, other, msg, result(&copies, idem.Result{Body: []byte("copy")}), idem.InProgress, idem.ErrInProgress)
			if out.RetryAfter > renewalLease {
				t.Errorf("%s: RetryAfter = %v, want at most the lease %v", what, out.RetryAfter, renewalLease)
			}
		}
		b.wantCalls("copies delivered while the long handler ran (a takeover)", &copies, 0)
		close(release)
		r, ok := await(t, done, "the long handler's Process")
		if !ok {
			return
		}
		b.wantOutcome("long handler", msg.ID, r.out, r.err, idem.Processed, nil)
		b.wantAttempt("long handler", r.out, 1)
		b.wantResult("long handler", r.out.Result, r.out.ContentType, want)
		if n := runs.Load(); n != 1 {
			t.Errorf("long handler runs = %d, want 1", n)
		}
		b.process("redelivery", other, msg, result(&copies, idem.Result{}), idem.Duplicate, nil)
	})
}

// lostLease is the lease of the lost-lease case: renewals every 50ms.
const lostLease = 150 * time.Millisecond

// A renewal that finds the lease lost (another attempt took over and
// completed) cancels the handler's context with cause ErrLeaseLost, and
// that attempt's Process is Failed with ErrLeaseLost.
func testLeaseLostCancelsHandler(t *testing.T, b *leaseBundle) {
	gate := make(chan struct{}) // holds attempt 1's renewals until the takeover completed
	defer func() {
		select {
		case <-gate:
		default:
			close(gate)
		}
	}()
	spy := newSpyStore(b.s.Store, gate)
	c := b.consumerOn(spy, "c", idem.Config{Lease: lostLease})
	other := b.consumer("c", idem.Config{Lease: lostLease})
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}
	entered := make(chan struct{})
	causes := make(chan error, 1)
	done := b.goProcess(c, msg, func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
		close(entered)
		t := time.NewTimer(blockTimeout)
		defer t.Stop()
		select {
		case <-ctx.Done():
			causes <- context.Cause(ctx)
			return idem.Result{}, context.Cause(ctx)
		case <-t.C:
			causes <- nil
			return idem.Result{Body: []byte("never cancelled")}, nil
		}
	})
	if !waitFor(t, entered, "attempt 1's handler starting") {
		return
	}
	b.expire(c.Name(), msg.ID)
	var calls atomic.Int64
	fresh := idem.Result{Body: []byte("fresh")}
	out := b.process("takeover", other, msg, result(&calls, fresh), idem.Processed, nil)
	b.wantAttempt("takeover", out, 2)
	close(gate)

	cause, ok := await(t, causes, "attempt 1's handler context being cancelled")
	if !ok {
		return
	}
	if !errors.Is(cause, idem.ErrLeaseLost) {
		t.Errorf("attempt 1's handler context: Cause = %v, want ErrLeaseLost (a renewal found the lease lost)", cause)
	}
	r, ok := await(t, done, "attempt 1's Process")
	if !ok {
		return
	}
	b.wantOutcome("attempt 1 after losing its lease", msg.ID, r.out, r.err, idem.Failed, idem.ErrLeaseLost)
	b.wantPoison("attempt 1 after losing its lease", r.out, false)
	out = b.process("redelivery", other, msg, result(&calls, idem.Result{}), idem.Duplicate, nil)
	b.wantResult("redelivery", out.Result, out.ContentType, fresh)
}

// unitsLease is the lease of the time-units case: 1.5s, so a store mixing
// seconds and milliseconds (or rounding to seconds) reports a remaining
// lease outside (0, 1.5s] or never lets it run out.
const unitsLease = 1500 * time.Millisecond

// one time unit end to end. While a 1.5s lease has more
// than a second left, Acquire reports the record in progress with a
// LeaseRemaining between what is left by the caller's clock (minus 10ms for
// rounding) and the lease, and the LeaseConsumer's InProgress asks for a
// RetryAfter in (0, Lease]. Once the lease ends, the next delivery takes
// over.
func testLeaseTimeUnits(t *testing.T, b *leaseBundle) {
	c := b.consumer("c", idem.Config{Lease: unitsLease})
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}
	var calls atomic.Int64
	h := result(&calls, idem.Result{Body: []byte("ok")})

	start := time.Now()
	b.mustAcquire("attempt 1 with a 1.5s lease", c.Name(), msg, unitsLease, 1)
	res := b.acquire("while the lease is live", c.Name(), msg, unitsLease)
	elapsed := time.Since(start)
	out, err := c.Process(b.ctx, msg, h)
	if total := time.Since(start); total > time.Second {
		t.Skipf("%v passed between the acquire and the checks (the machine stalled); a 1.5s lease cannot be checked", total)
	}
	b.wantNotAcquired("Acquire while the lease is live", res, idemdriver.StateInProgress)
	if lo := unitsLease - elapsed - 10*time.Millisecond; res.LeaseRemaining < lo || res.LeaseRemaining > unitsLease || res.LeaseRemaining <= 0 {
		t.Errorf("LeaseRemaining = %v (%d ns) %v after acquiring a %v lease; want between %v and %v (seconds and milliseconds mixed?)",
			res.LeaseRemaining, int64(res.LeaseRemaining), elapsed, unitsLease, max(lo, 0), unitsLease)
	}
	b.wantOutcome("delivery while the lease is live", msg.ID, out, err, idem.InProgress, idem.ErrInProgress)
	if out.RetryAfter <= 0 || out.RetryAfter > unitsLease {
		t.Errorf("RetryAfter = %v, want in (0, %v]", out.RetryAfter, unitsLease)
	}
	b.wantCalls("while the lease is live", &calls, 0)

	b.expire(c.Name(), msg.ID)
	out = b.process("delivery after the lease ended", c, msg, h, idem.Processed, nil)
	b.wantAttempt("delivery after the lease ended", out, 2)
	b.wantCalls("after the takeover", &calls, 1)
}

// The shortest lease the LeaseConsumer accepts, MinLease, works end to end;
// and a 1ms lease is accepted by the store, is neither rounded down to "no
// lease" (stuck for ever) nor up to a second (seconds and milliseconds mixed): it runs
// out by itself well within a second and the next Acquire takes over.
func testLeaseOneMillisecond(t *testing.T, b *leaseBundle) {
	c := b.consumer("c", idem.Config{Lease: idem.MinLease})
	var calls atomic.Int64
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}
	want := idem.Result{Body: []byte("ok")}
	out := b.process("1ms lease", c, msg, result(&calls, want), idem.Processed, nil)
	b.wantResult("1ms lease", out.Result, out.ContentType, want)
	b.process("1ms lease, redelivery", c, msg, result(&calls, want), idem.Duplicate, nil)
	b.wantCalls("1ms lease", &calls, 1)

	consumer := b.name("direct")
	m2 := idem.Message{ID: "m-2", Payload: []byte("p")}
	start := time.Now()
	a1 := b.mustAcquire("Acquire with a 1ms lease", consumer, m2, time.Millisecond, 1)
	for polls := 1; ; polls++ {
		res := b.acquire("Acquire after a 1ms lease", consumer, m2, time.Millisecond)
		if res.Acquired {
			if res.Attempt != 2 || res.Token <= a1.Token {
				t.Errorf("takeover of a 1ms lease: attempt %d, token %d; want attempt 2 and a token above %d", res.Attempt, res.Token, a1.Token)
			}
			if d := time.Since(start); d > 900*time.Millisecond {
				t.Errorf("a 1ms lease took %v (%d polls) to run out, want well under a second (rounded up to seconds?)", d, polls)
			}
			break
		}
		if res.State != idemdriver.StateInProgress || res.LeaseRemaining > time.Millisecond {
			t.Errorf("Acquire during a 1ms lease: state %v, LeaseRemaining %v; want in_progress and at most 1ms", res.State, res.LeaseRemaining)
			break
		}
		if d := time.Since(start); d > blockTimeout {
			t.Errorf("a 1ms lease did not run out in %v (%d polls): a lease without expiry?", d, polls)
			break
		}
		runtime.Gosched()
	}
}

// Tokens strictly increase over takeovers, whether the lease expired or
// was released, and attempt numbers count up by one; the LeaseConsumer
// hands both to the handler.
func testLeaseTokensIncrease(t *testing.T, b *leaseBundle) {
	consumer := b.name("direct")
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}
	var prev int64
	for n := 1; n <= 6; n++ {
		a := b.mustAcquire(fmt.Sprintf("attempt %d", n), consumer, msg, longLease, n)
		if a.Token <= prev {
			t.Errorf("attempt %d: token %d, want more than %d (attempt %d's)", n, a.Token, prev, n-1)
		}
		prev = a.Token
		if n%2 == 1 {
			if err := b.s.Store.Release(b.ctx, &idemdriver.ReleaseParams{Consumer: consumer, MessageID: msg.ID, Token: a.Token, Error: "retry"}); err != nil {
				t.Fatalf("attempt %d: Release: %v", n, err)
			}
		} else {
			b.expire(consumer, msg.ID)
		}
	}

	c := b.consumer("c", idem.Config{MaxAttempts: 5})
	type seen struct {
		number int
		token  int64
	}
	var attempts []seen
	h := func(_ context.Context, a *idem.Attempt) (idem.Result, error) {
		attempts = append(attempts, seen{a.Number, a.Token})
		if a.Number < 4 {
			return idem.Result{}, errBoom
		}
		return idem.Result{Body: []byte("ok")}, nil
	}
	for n := 1; n <= 4; n++ {
		want, wantErr := idem.Failed, error(errBoom)
		if n == 4 {
			want, wantErr = idem.Processed, nil
		}
		out := b.process(fmt.Sprintf("delivery %d", n), c, msg, h, want, wantErr)
		b.wantAttempt(fmt.Sprintf("delivery %d", n), out, n)
	}
	for i, a := range attempts {
		if a.number != i+1 {
			t.Errorf("handler run %d: Attempt.Number = %d, want %d", i+1, a.number, i+1)
		}
		if i > 0 && a.token <= attempts[i-1].token {
			t.Errorf("handler run %d: Attempt.Token = %d, want more than %d", i+1, a.token, attempts[i-1].token)
		}
	}
	if len(attempts) != 4 {
		t.Errorf("handler runs = %d, want 4", len(attempts))
	}
}

package idemtest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// The Steps cases check the recovery points that Acquire and Release save
// with the acquisition or the release (idemdriver.StepRecorder), directly
// and through the LeaseConsumer. The store cases need the capability; the
// consumer cases run on any store, and on one without the capability
// they check the core's fallback (one SaveStep each).
func leaseStepCases() []leaseCase {
	return []leaseCase{
		{"AcquireSavesRunPoint", testLeaseStepAcquire},
		{"ConcurrentAcquireOnePoint", testLeaseStepConcurrentAcquire},
		{"ReleaseSavesPoint", testLeaseStepRelease},
		{"Validation", testLeaseStepValidation},
		{"ConsumerRoundTrips", testLeaseStepConsumer},
		{"RoundTripsPerCase", testLeaseStepRoundTrips},
	}
}

// needRecorder skips a case for a store without the capability.
func (b *leaseBundle) needRecorder() {
	b.t.Helper()
	if !idemdriver.RecordsSteps(b.s.Store) {
		b.t.Skip("the store is not an idemdriver.StepRecorder")
	}
}

// acquireWith calls Store.Acquire for msg with a step prefix.
func (b *leaseBundle) acquireWith(what, consumer string, msg idem.Message, prefix string) idemdriver.AcquireResult {
	b.t.Helper()
	res, err := b.s.Store.Acquire(b.ctx, &idemdriver.AcquireParams{
		Consumer: consumer, MessageID: msg.ID, Fingerprint: fingerprint(msg.Payload), Lease: longLease, StepPrefix: prefix,
	})
	if err != nil {
		b.t.Fatalf("%s: Store.Acquire(%q, %q, StepPrefix %q): %v", what, consumer, msg.ID, prefix, err)
	}
	return res
}

// Acquire with a StepPrefix saves the acquiring attempt's point, which a
// takeover sees (its own point not among its Steps); an Acquire that
// does not acquire saves nothing; the stale holder stays fenced out.
func testLeaseStepAcquire(t *testing.T, b *leaseBundle) {
	b.needRecorder()
	consumer := b.name("c")
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}
	run := func(tok int64) string { return idemdriver.PrefixStep("run:", tok) }

	a1 := b.acquireWith("attempt 1", consumer, msg, "run:")
	if !a1.Acquired || a1.Attempt != 1 {
		t.Fatalf("attempt 1: Acquired %v, Attempt %d; want acquired, 1", a1.Acquired, a1.Attempt)
	}
	b.wantSteps("attempt 1 (its own point is not an earlier attempt's)", a1.Steps, nil)
	busy := b.acquireWith("while attempt 1 holds a live lease", consumer, msg, "run:")
	b.wantNotAcquired("while attempt 1 holds a live lease", busy, idemdriver.StateInProgress)

	b.expire(consumer, msg.ID)
	a2 := b.acquireWith("attempt 2, a takeover", consumer, msg, "run:")
	if !a2.Acquired || a2.Attempt != 2 || a2.Token <= a1.Token {
		t.Fatalf("attempt 2: Acquired %v, Attempt %d, token %d; want acquired, 2, more than %d", a2.Acquired, a2.Attempt, a2.Token, a1.Token)
	}
	b.wantSteps("attempt 2 sees attempt 1's run point, not its own", a2.Steps, map[string][]byte{run(a1.Token): {}})
	b.wantStaleRejected("attempt 1 after the takeover", consumer, msg.ID, a1.Token)

	// A takeover without a prefix saves nothing and sees both points.
	b.expire(consumer, msg.ID)
	a3 := b.mustAcquire("attempt 3, without a prefix", consumer, msg, longLease, 3)
	b.wantSteps("attempt 3", a3.Steps, map[string][]byte{run(a1.Token): {}, run(a2.Token): {}})
	b.expire(consumer, msg.ID)
	a4 := b.mustAcquire("attempt 4", consumer, msg, longLease, 4)
	b.wantSteps("attempt 4 (attempt 3 saved no point)", a4.Steps, map[string][]byte{run(a1.Token): {}, run(a2.Token): {}})
	if err := b.s.Store.Complete(b.ctx, &idemdriver.CompleteParams{Consumer: consumer, MessageID: msg.ID, Token: a4.Token, Result: []byte("r")}); err != nil {
		t.Fatalf("Complete of attempt 4: %v", err)
	}
	done := b.acquireWith("after completion", consumer, msg, "run:")
	b.wantNotAcquired("after completion", done, idemdriver.StateCompleted)
	b.wantRecords("at the end", consumer, 1)
}

// Of concurrent Acquire calls with a prefix exactly one acquires, and
// exactly its point is saved: the takeover sees that one only.
func testLeaseStepConcurrentAcquire(t *testing.T, b *leaseBundle) {
	b.needRecorder()
	consumer := b.name("c")
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}
	res := make([]idemdriver.AcquireResult, concurrency)
	errs := make([]error, concurrency)
	race(concurrency, func(i int) {
		res[i], errs[i] = b.s.Store.Acquire(b.ctx, &idemdriver.AcquireParams{
			Consumer: consumer, MessageID: msg.ID, Fingerprint: fingerprint(msg.Payload), Lease: longLease, StepPrefix: "run:",
		})
	})
	var won []idemdriver.AcquireResult
	for i, r := range res {
		switch {
		case errs[i] != nil:
			t.Errorf("Acquire %d: %v", i, errs[i])
		case r.Acquired:
			won = append(won, r)
		}
	}
	if len(won) != 1 {
		t.Fatalf("%d of %d concurrent Acquire calls acquired, want exactly 1", len(won), concurrency)
	}
	b.expire(consumer, msg.ID)
	a2 := b.mustAcquire("the takeover", consumer, msg, longLease, 2)
	b.wantSteps("the takeover", a2.Steps, map[string][]byte{idemdriver.PrefixStep("run:", won[0].Token): {}})
}

// Release with a Step saves it with the release (an existing step keeps
// its first result); a stale Release with a Step fails with ErrLeaseLost
// and saves nothing.
func testLeaseStepRelease(t *testing.T, b *leaseBundle) {
	b.needRecorder()
	consumer := b.name("c")
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}
	s := b.s.Store
	a1 := b.acquireWith("attempt 1", consumer, msg, "run:")
	if err := s.SaveStep(b.ctx, &idemdriver.StepParams{Consumer: consumer, MessageID: msg.ID, Token: a1.Token, Step: "kept", Result: []byte("first")}); err != nil {
		t.Fatalf("SaveStep: %v", err)
	}
	if err := s.Release(b.ctx, &idemdriver.ReleaseParams{Consumer: consumer, MessageID: msg.ID, Token: a1.Token, Error: "retry", Step: "kept"}); err != nil {
		t.Fatalf("Release with an existing Step: %v", err)
	}
	a2 := b.acquireWith("attempt 2", consumer, msg, "run:")
	if !a2.Acquired {
		t.Fatalf("attempt 2 did not acquire after the release (state %v)", a2.State)
	}
	b.wantSteps("attempt 2", a2.Steps, map[string][]byte{idemdriver.PrefixStep("run:", a1.Token): {}, "kept": []byte("first")})
	settled := idemdriver.PrefixStep("settled:", a2.Token)
	if err := s.Release(b.ctx, &idemdriver.ReleaseParams{Consumer: consumer, MessageID: msg.ID, Token: a2.Token, Error: "retry", Step: settled}); err != nil {
		t.Fatalf("Release of attempt 2 with Step %q: %v", settled, err)
	}
	if err := s.Release(b.ctx, &idemdriver.ReleaseParams{Consumer: consumer, MessageID: msg.ID, Token: a1.Token, Error: "stale", Step: "stale-point"}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Errorf("stale Release with a Step = %v, want an error matching ErrLeaseLost", err)
	}
	a3 := b.mustAcquire("attempt 3", consumer, msg, longLease, 3)
	b.wantSteps("attempt 3 (the stale release saved nothing)", a3.Steps, map[string][]byte{
		idemdriver.PrefixStep("run:", a1.Token): {}, idemdriver.PrefixStep("run:", a2.Token): {}, "kept": []byte("first"), settled: {},
	})
	if err := s.Release(b.ctx, &idemdriver.ReleaseParams{Consumer: consumer, MessageID: msg.ID, Token: a3.Token, Error: errText, Terminal: true, Step: "last"}); err != nil {
		t.Fatalf("terminal Release with a Step: %v", err)
	}
	res := b.acquire("after the terminal release", consumer, msg, longLease)
	b.wantNotAcquired("after the terminal release", res, idemdriver.StateFailed)
	if res.Error != errText {
		t.Errorf("failed record: Error %q, want %q", res.Error, errText)
	}
}

// An invalid StepPrefix (one that cannot make a valid step name with
// every token) or Step is refused with ErrInvalidConfig before anything
// is written.
func testLeaseStepValidation(t *testing.T, b *leaseBundle) {
	b.needRecorder()
	consumer := b.name("c")
	fp := fingerprint([]byte("p"))
	for _, prefix := range []string{"run\x00", "bad\n", strings.Repeat("p", idemdriver.MaxStepNameLength-18)} {
		_, err := b.s.Store.Acquire(b.ctx, &idemdriver.AcquireParams{Consumer: consumer, MessageID: "m-1", Fingerprint: fp, Lease: longLease, StepPrefix: prefix})
		if !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("Acquire with StepPrefix of %d bytes %.10q: err = %v, want an error matching ErrInvalidConfig", len(prefix), prefix, err)
		}
	}
	b.wantRecords("after the refused acquires", consumer, 0)
	longest := strings.Repeat("p", idemdriver.MaxStepNameLength-19)
	a := b.acquireWith("with the longest prefix", consumer, idem.Message{ID: "m-1", Payload: []byte("p")}, longest)
	if !a.Acquired {
		t.Fatalf("Acquire with a prefix of %d bytes did not acquire", len(longest))
	}
	err := b.s.Store.Release(b.ctx, &idemdriver.ReleaseParams{Consumer: consumer, MessageID: "m-1", Token: a.Token, Error: "e", Step: "bad\x01"})
	if !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("Release with an invalid Step: err = %v, want an error matching ErrInvalidConfig", err)
	}
	b.wantStillHeld("after the refused release", consumer, "m-1", a.Token)
}

// wantStillHeld checks that token still owns consumer's record id.
func (b *leaseBundle) wantStillHeld(what, consumer, id string, token int64) {
	b.t.Helper()
	if err := b.s.Store.Renew(b.ctx, &idemdriver.RenewParams{Consumer: consumer, MessageID: id, Token: token, Lease: longLease}); err != nil {
		b.t.Errorf("%s: Renew with token %d = %v, want nil (still held)", what, token, err)
	}
}

// stepCounter decorates a LeaseStore and counts its SaveStep calls; it
// hides the store's StepRecorder capability unless recorder is set, as a
// store written before it would.
type stepCounter struct {
	idemdriver.LeaseStore
	recorder bool
	saves    atomic.Int64
}

func (s *stepCounter) SaveStep(ctx context.Context, p *idemdriver.StepParams) error {
	s.saves.Add(1)
	return s.LeaseStore.SaveStep(ctx, p)
}

func (s *stepCounter) RecordsSteps() bool { return s.recorder && idemdriver.RecordsSteps(s.LeaseStore) }

// Through the LeaseConsumer: an attempt acquired with StepPrefix has its
// run point at once (Completed), a crash leaves it for the takeover, whose
// Steps show the earlier point and its own; SaveStepOnRelease saves a
// point with the release. A StepRecorder store does both with no SaveStep
// call; one without the capability gets one SaveStep per point.
func testLeaseStepConsumer(t *testing.T, b *leaseBundle) {
	for _, tc := range []struct {
		name      string
		recorder  bool
		wantSaves int64
	}{{"recorder", true, 0}, {"without the capability", false, 3}} {
		if tc.recorder && !idemdriver.RecordsSteps(b.s.Store) {
			continue
		}
		store := &stepCounter{LeaseStore: b.s.Store, recorder: tc.recorder}
		c := b.consumerOn(store, "c-"+strings.ReplaceAll(tc.name, " ", "-"), idem.Config{})
		msg := idem.Message{ID: "m-1", Payload: []byte("p")}
		opt := idem.AcquireOptions{StepPrefix: "run:"}
		a1, out, err := c.Acquire(b.ctx, msg, opt)
		if a1 == nil {
			t.Fatalf("%s: attempt 1 not acquired: %v, %v", tc.name, out.Status, err)
		}
		run1 := idemdriver.PrefixStep("run:", a1.Token)
		if !a1.Completed(run1) {
			t.Errorf("%s: attempt 1: Completed(%q) = false, want its run point saved with the acquisition", tc.name, run1)
		}
		_, _ = a1.Abandon(b.ctx, errors.New("crash"))
		b.expire(c.Name(), msg.ID)
		a2, out, err := c.Acquire(b.ctx, msg, opt)
		if a2 == nil {
			t.Fatalf("%s: attempt 2 not acquired: %v, %v", tc.name, out.Status, err)
		}
		run2 := idemdriver.PrefixStep("run:", a2.Token)
		b.wantSteps(tc.name+": attempt 2", a2.Steps(), map[string][]byte{run1: {}, run2: {}})
		settled := idemdriver.PrefixStep("settled:", a2.Token)
		if err := a2.SaveStepOnRelease(settled); err != nil {
			t.Fatalf("%s: SaveStepOnRelease: %v", tc.name, err)
		}
		if _, err := a2.Release(b.ctx, errors.New("known failure")); err == nil || errors.Is(err, idem.ErrStore) || errors.Is(err, idem.ErrLeaseLost) {
			t.Fatalf("%s: Release = %v, want the cause alone", tc.name, err)
		}
		a3, out, err := c.Acquire(b.ctx, msg, idem.AcquireOptions{})
		if a3 == nil {
			t.Fatalf("%s: attempt 3 not acquired after the release: %v, %v", tc.name, out.Status, err)
		}
		b.wantSteps(tc.name+": attempt 3", a3.Steps(), map[string][]byte{run1: {}, run2: {}, settled: {}})
		if _, err := a3.Complete(b.ctx, idem.Result{Body: []byte("done")}); err != nil {
			t.Fatalf("%s: Complete of attempt 3: %v", tc.name, err)
		}
		if got := store.saves.Load(); got != tc.wantSaves {
			t.Errorf("%s: %d SaveStep calls, want %d", tc.name, got, tc.wantSaves)
		}
	}
}

// MeasureRoundTrips on the store: with the StepRecorder capability a new
// message costs two calls (Acquire, Complete), a duplicate one, a release
// one; without it, one SaveStep more for a new message and for a release.
func testLeaseStepRoundTrips(t *testing.T, b *leaseBundle) {
	// want is the calls per message of each case, and the SaveStep
	// calls among them.
	type want struct {
		hide                   bool
		newMsg, dup, release   int64
		newSaves, releaseSaves int64
	}
	cases := []want{{true, 3, 1, 2, 1, 1}}
	if idemdriver.RecordsSteps(b.s.Store) {
		cases = append(cases, want{false, 2, 1, 1, 0, 0})
	}
	const n = 3
	for _, tc := range cases {
		rt, err := MeasureRoundTrips(b.ctx, b.s.Store, b.name(fmt.Sprintf("rt-hide-%v", tc.hide)), n, tc.hide)
		if err != nil {
			t.Fatalf("MeasureRoundTrips (capability hidden: %v): %v", tc.hide, err)
		}
		for _, c := range []struct {
			what        string
			got         Calls
			want, saves int64
		}{{"new message", rt.New, tc.newMsg, tc.newSaves}, {"duplicate", rt.Duplicate, tc.dup, 0}, {"release", rt.Release, tc.release, tc.releaseSaves}} {
			if c.got.Total() != c.want*n || c.got.SaveStep != c.saves*n {
				t.Errorf("capability hidden: %v: %s: %s per message, want %d calls (%d SaveStep)", tc.hide, c.what, c.got.PerMessage(n), c.want, c.saves)
			}
		}
	}
}

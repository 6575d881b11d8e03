package idemtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// longLease is the lease of the cases that must see neither a renewal nor
// a natural expiry while they run: leases there end only by ExpireLease,
// Release or Complete, so the cases do not depend on timing.
const longLease = 10 * time.Minute

// leaseCase is one named lease-mode conformance case.
type leaseCase struct {
	name string
	run  func(t *testing.T, b *leaseBundle)
}

// RunLease runs the lease-mode conformance suite against the store that h
// builds: through [idem.LeaseConsumer] (claim, replay, concurrent copies,
// expiry and takeover with fencing tokens, renewal, retries with recovery
// points, poison messages, fingerprints on every path, retention) and
// directly through the [idemdriver.LeaseStore] contract. Each case is a parallel
// subtest that calls h.New for a fresh LeaseSetup.
//
// What a lease store must do, as the cases check it, beyond the
// LeaseStore doc:
//   - Acquire refuses a lease that is not positive with an error matching
//     idem.ErrInvalidConfig (never a record without expiry),
//     and fails with an error matching context.Canceled, recording nothing,
//     when its context has ended.
//   - Tokens are positive. Of concurrent Acquire calls on a new message, or
//     on an expired one, exactly one acquires; the others see the record
//     with its attempt count and, while the lease is live, LeaseRemaining in
//     (0, lease], measured by the store's clock in the unit of
//     time.Duration. A lease of 1ms works and runs out.
//   - A lease that ended (expired, or released) is taken over by the next
//     Acquire with the same fingerprint, never by another fingerprint.
//   - After Release or Complete, the attempt's token owns nothing: its
//     Renew, Complete, Release and SaveStep fail with idem.ErrLeaseLost and
//     change nothing. An expired lease that nobody took over is still
//     owned: its Complete succeeds.
//   - Results, content types, error texts, fingerprints and recovery points
//     are stored byte for byte: binary, empty (an empty step result still
//     marks the step done), and results of 1 MiB.
//   - Purge never deletes an in_progress record, live, expired or released.
//   - A store that is an idemdriver.StepRecorder saves the point of
//     AcquireParams.StepPrefix with the acquisition only (a takeover sees
//     the earlier attempts' points, never its own, and one of concurrent
//     calls saves one point), and ReleaseParams.Step with the release
//     only; the LeaseConsumer then saves neither with SaveStep.
//   - A store that is an idemdriver.LeaseBatcher judges every element of
//     AcquireBatch and CompleteBatch as the single call would, in order, and
//     reports the results in the order given (the Batch cases, skipped for
//     a store without it).
//   - A store that is an idemdriver.LeaseBatchRenewer judges every lease
//     of RenewBatch as Renew would, fencing per lease, results in the
//     order given, and a LeaseConsumer over it learns of a taken-over
//     lease for that attempt only (the RenewBatch cases, skipped for a
//     store without it).
//
// What the LeaseConsumer must do over any store, as the StoreTimeout
// cases check it (the calls that stall stop short of the store): a store
// call that stalls, batched (internal/leasebatch) or not, ends at
// Config.StoreTimeout from its start, its context's deadline, with an
// error matching idem.ErrStoreTimeout, and the delivery is not
// acknowledged; the message is processed when redelivered.
func RunLease(t *testing.T, h LeaseHarness) {
	t.Helper()
	if h.New == nil {
		t.Fatal("idemtest: LeaseHarness.New is nil")
	}
	nonce := newNonce()
	groups := []struct {
		name  string
		cases []leaseCase
	}{
		{"Process", leaseProcessCases()},
		{"Expiry", leaseExpiryCases()},
		{"Remaining", leaseRemainingCases()},
		{"Failure", leaseFailureCases()},
		{"Fingerprint", leaseFingerprintCases()},
		{"Purge", leasePurgeCases()},
		{"Store", leaseStoreCases()},
		{"Steps", leaseStepCases()},
		{"Batch", leaseBatchCases()},
		{"ConsumerBatch", leaseConsumerBatchCases()},
		{"RenewBatch", leaseRenewBatchCases()},
		{"StoreTimeout", leaseDeadlineCases()},
		{"Locked", leaseLockedCases()},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			for _, c := range g.cases {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					c.run(t, newLeaseBundle(t, h, nonce, "lease."+g.name+"."+c.name))
				})
			}
		})
	}
}

// leaseBundle is one lease case's state: its LeaseSetup, a context bounded
// by caseTimeout, and a prefix that makes its consumer names unique.
type leaseBundle struct {
	t      *testing.T
	s      *LeaseSetup
	ctx    context.Context
	prefix string
}

func newLeaseBundle(t *testing.T, h LeaseHarness, nonce, name string) *leaseBundle {
	t.Helper()
	s := h.New(t)
	switch {
	case s == nil:
		t.Fatal("idemtest: LeaseHarness.New returned nil")
	case s.Store == nil, s.ExpireLease == nil, s.CountRecords == nil, s.Shift == nil:
		t.Fatal("idemtest: LeaseSetup has a nil field; Store, ExpireLease, CountRecords and Shift are all required")
	}
	ctx, cancel := context.WithTimeout(t.Context(), caseTimeout)
	t.Cleanup(cancel)
	return &leaseBundle{t: t, s: s, ctx: ctx, prefix: "idemtest-" + nonce + "-" + name}
}

// name returns the unique consumer name for suffix.
func (b *leaseBundle) name(suffix string) string { return b.prefix + "." + suffix }

// consumer returns a LeaseConsumer named b.name(suffix) over the Setup's
// store, closed at the end of the test. The purge loop is off unless cfg
// sets PurgeInterval, and the lease is longLease unless cfg sets Lease.
// Two calls with one suffix give two consumers of the same name, as two
// processes (or one after a restart) would be.
func (b *leaseBundle) consumer(suffix string, cfg idem.Config) *idem.LeaseConsumer {
	b.t.Helper()
	return b.consumerOn(b.s.Store, suffix, cfg)
}

func (b *leaseBundle) consumerOn(store idemdriver.LeaseStore, suffix string, cfg idem.Config) *idem.LeaseConsumer {
	b.t.Helper()
	cfg.Name = b.name(suffix)
	if cfg.PurgeInterval == 0 {
		cfg.PurgeInterval = -1
	}
	if cfg.Lease == 0 {
		cfg.Lease = longLease
	}
	c, err := idem.NewLeaseConsumer(store, cfg)
	if err != nil {
		b.t.Fatalf("NewLeaseConsumer(%q): %v", cfg.Name, err)
	}
	b.t.Cleanup(func() { _ = c.Close() })
	return c
}

// fingerprint is the fingerprint the LeaseConsumer computes for payload
// with its default Fingerprinter.
func fingerprint(payload []byte) []byte {
	fp, err := idem.SHA256Fingerprint(payload)
	if err != nil {
		panic(err)
	}
	return fp
}

// acquire calls Store.Acquire for msg as the LeaseConsumer would.
func (b *leaseBundle) acquire(what, consumer string, msg idem.Message, lease time.Duration) idemdriver.AcquireResult {
	b.t.Helper()
	res, err := b.s.Store.Acquire(b.ctx, &idemdriver.AcquireParams{
		Consumer: consumer, MessageID: msg.ID, Fingerprint: fingerprint(msg.Payload), Lease: lease,
	})
	if err != nil {
		b.t.Fatalf("%s: Store.Acquire(%q, %q): %v", what, consumer, msg.ID, err)
	}
	return res
}

// mustAcquire acquires msg and requires attempt number wantAttempt.
func (b *leaseBundle) mustAcquire(what, consumer string, msg idem.Message, lease time.Duration, wantAttempt int) idemdriver.AcquireResult {
	b.t.Helper()
	res := b.acquire(what, consumer, msg, lease)
	if !res.Acquired {
		b.t.Fatalf("%s: Store.Acquire did not acquire (found state %v, attempt %d, lease remaining %v); want attempt %d acquired",
			what, res.State, res.Attempt, res.LeaseRemaining, wantAttempt)
	}
	if res.Attempt != wantAttempt {
		b.t.Errorf("%s: Attempt = %d, want %d", what, res.Attempt, wantAttempt)
	}
	if res.Token <= 0 {
		b.t.Errorf("%s: Token = %d, want a positive fencing token", what, res.Token)
	}
	return res
}

// wantNotAcquired checks an Acquire that found a record in state want.
func (b *leaseBundle) wantNotAcquired(what string, res idemdriver.AcquireResult, want idemdriver.RecordState) {
	b.t.Helper()
	if res.Acquired {
		b.t.Errorf("%s: Store.Acquire acquired (attempt %d, token %d); want the existing %v record reported", what, res.Attempt, res.Token, want)
		return
	}
	if res.State != want {
		b.t.Errorf("%s: Store.Acquire found state %v, want %v", what, res.State, want)
	}
}

// expire ends the lease of consumer's record id through the Setup.
func (b *leaseBundle) expire(consumer, id string) {
	b.t.Helper()
	if err := b.s.ExpireLease(b.ctx, consumer, id); err != nil {
		b.t.Fatalf("ExpireLease(%q, %q): %v", consumer, id, err)
	}
}

// wantRecords checks consumer's record count, all states together.
func (b *leaseBundle) wantRecords(what, consumer string, want int) {
	b.t.Helper()
	got, err := b.s.CountRecords(b.ctx, consumer)
	if err != nil {
		b.t.Fatalf("%s: CountRecords: %v", what, err)
	}
	if got != want {
		b.t.Errorf("%s: records of consumer %q = %d, want %d", what, consumer, got, want)
	}
}

// wantOutcome checks one lease-mode delivery: its status and MessageID,
// that the returned error is out.Err and matches wantErr (nil: no error),
// Ack, a RetryAfter exactly for InProgress, and Poison only on Failed.
func (b *leaseBundle) wantOutcome(what, id string, out idem.Outcome, err error, want idem.Status, wantErr error) {
	b.t.Helper()
	checkOutcome(b.t, what, id, out, err, want, wantErr)
	if want == idem.InProgress && out.RetryAfter <= 0 {
		b.t.Errorf("%s: InProgress with RetryAfter %v, want a positive redelivery delay", what, out.RetryAfter)
	}
	if want != idem.InProgress && out.RetryAfter != 0 {
		b.t.Errorf("%s: %v with RetryAfter %v, want 0", what, out.Status, out.RetryAfter)
	}
	if out.Poison && out.Status != idem.Failed {
		b.t.Errorf("%s: Poison set on a %v outcome", what, out.Status)
	}
}

// process delivers msg through c and requires want.
func (b *leaseBundle) process(what string, c *idem.LeaseConsumer, msg idem.Message, h idem.LeaseHandler, want idem.Status, wantErr error) idem.Outcome {
	b.t.Helper()
	out, err := c.Process(b.ctx, msg, h)
	b.wantOutcome(what, msg.ID, out, err, want, wantErr)
	return out
}

// wantPoison checks that a Failed outcome is (or is not) poison, and that
// DeadLetter and IsPermanent agree.
func (b *leaseBundle) wantPoison(what string, out idem.Outcome, want bool) {
	b.t.Helper()
	if out.Poison != want {
		b.t.Errorf("%s: Poison = %v, want %v (err: %v)", what, out.Poison, want, out.Err)
	}
	if out.DeadLetter() != want {
		b.t.Errorf("%s: DeadLetter() = %v, want %v", what, out.DeadLetter(), want)
	}
	if got := errors.Is(out.Err, idem.ErrPoison); got != want {
		b.t.Errorf("%s: errors.Is(err, ErrPoison) = %v, want %v (err: %v)", what, got, want, out.Err)
	}
	if got := idem.IsPermanent(out.Err); got != want {
		b.t.Errorf("%s: IsPermanent(err) = %v, want %v (err: %v)", what, got, want, out.Err)
	}
}

// wantAttempt checks Outcome.Attempt.
func (b *leaseBundle) wantAttempt(what string, out idem.Outcome, want int) {
	b.t.Helper()
	if out.Attempt != want {
		b.t.Errorf("%s: Outcome.Attempt = %d, want %d", what, out.Attempt, want)
	}
}

// wantResult checks a stored or replayed result, byte for byte.
func (b *leaseBundle) wantResult(what string, gotBody []byte, gotType string, want idem.Result) {
	b.t.Helper()
	if d := diffBytes(gotBody, want.Body); d != "" {
		b.t.Errorf("%s: result %s", what, d)
	}
	if gotType != want.ContentType {
		b.t.Errorf("%s: content type = %q, want %q", what, gotType, want.ContentType)
	}
}

// wantCalls checks a handler call counter.
func (b *leaseBundle) wantCalls(what string, calls *atomic.Int64, want int64) {
	b.t.Helper()
	if got := calls.Load(); got != want {
		b.t.Errorf("%s: handler calls = %d, want %d", what, got, want)
	}
}

// diffBytes describes how got differs from want ("" if equal; nil and
// empty are equal), without printing a large result whole.
func diffBytes(got, want []byte) string {
	if bytes.Equal(got, want) {
		return ""
	}
	if len(got) <= 64 && len(want) <= 64 {
		return fmt.Sprintf("= %q, want %q", got, want)
	}
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	return fmt.Sprintf("is %d bytes, want %d; first difference at byte %d", len(got), len(want), i)
}

// result returns a handler that counts its calls and returns res.
func result(calls *atomic.Int64, res idem.Result) idem.LeaseHandler {
	return func(context.Context, *idem.Attempt) (idem.Result, error) {
		calls.Add(1)
		return res, nil
	}
}

// failing returns a handler that counts its calls and returns err.
func failing(calls *atomic.Int64, err error) idem.LeaseHandler {
	return func(context.Context, *idem.Attempt) (idem.Result, error) {
		calls.Add(1)
		return idem.Result{}, err
	}
}

// wantStaleRejected checks that token, which no longer owns consumer's
// record id, can neither renew, save a step, complete nor release it.
func (b *leaseBundle) wantStaleRejected(what, consumer, id string, token int64) {
	b.t.Helper()
	s := b.s.Store
	for _, op := range []struct {
		name string
		call func() error
	}{
		{"Renew", func() error {
			return s.Renew(b.ctx, &idemdriver.RenewParams{Consumer: consumer, MessageID: id, Token: token, Lease: longLease})
		}},
		{"SaveStep", func() error {
			return s.SaveStep(b.ctx, &idemdriver.StepParams{Consumer: consumer, MessageID: id, Token: token, Step: "stale-step", Result: []byte("stale")})
		}},
		{"Complete", func() error {
			return s.Complete(b.ctx, &idemdriver.CompleteParams{Consumer: consumer, MessageID: id, Token: token, Result: []byte("stale result"), ContentType: "text/stale"})
		}},
		{"Release", func() error {
			return s.Release(b.ctx, &idemdriver.ReleaseParams{Consumer: consumer, MessageID: id, Token: token, Error: "stale release", Terminal: true})
		}},
	} {
		if err := op.call(); !errors.Is(err, idem.ErrLeaseLost) {
			b.t.Errorf("%s: %s with token %d = %v, want an error matching ErrLeaseLost", what, op.name, token, err)
		}
	}
}

// wantSteps checks the recovery points an Acquire returned.
func (b *leaseBundle) wantSteps(what string, got, want map[string][]byte) {
	b.t.Helper()
	for name, w := range want {
		g, ok := got[name]
		switch {
		case !ok:
			b.t.Errorf("%s: recovery point %q missing (got %d points), want %q", what, name, len(got), w)
		case !bytes.Equal(g, w):
			b.t.Errorf("%s: recovery point %q %s", what, name, diffBytes(g, w))
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			b.t.Errorf("%s: unexpected recovery point %q = %q", what, name, got[name])
		}
	}
}

// spyStore decorates a LeaseStore: it counts each token's successful
// renewals, and with a gate it holds every Renew call until the gate
// closes (or the call's context ends).
type spyStore struct {
	idemdriver.LeaseStore
	gate chan struct{} // nil: renewals pass

	mu      sync.Mutex
	renews  map[int64]int
	changed chan struct{} // closed and replaced at each successful renewal
}

func newSpyStore(inner idemdriver.LeaseStore, gate chan struct{}) *spyStore {
	return &spyStore{LeaseStore: inner, gate: gate, renews: map[int64]int{}, changed: make(chan struct{})}
}

func (s *spyStore) Renew(ctx context.Context, p *idemdriver.RenewParams) error {
	if s.gate != nil {
		select {
		case <-s.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	err := s.LeaseStore.Renew(ctx, p)
	if err == nil {
		s.mu.Lock()
		s.renews[p.Token]++
		close(s.changed)
		s.changed = make(chan struct{})
		s.mu.Unlock()
	}
	return err
}

// waitRenewals waits until token has been renewed n times, failing the
// test after blockTimeout.
func (s *spyStore) waitRenewals(t *testing.T, token int64, n int) bool {
	t.Helper()
	deadline := time.NewTimer(blockTimeout)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		got, ch := s.renews[token], s.changed
		s.mu.Unlock()
		if got >= n {
			return true
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Errorf("token %d renewed %d times in %v, want at least %d (renewal every Lease/3)", token, got, blockTimeout, n)
			return false
		}
	}
}

// await receives from ch, failing the test after blockTimeout.
func await[T any](t *testing.T, ch <-chan T, what string) (T, bool) {
	t.Helper()
	select {
	case v := <-ch:
		return v, true
	case <-time.After(blockTimeout):
		t.Errorf("%s: nothing after %v", what, blockTimeout)
		var zero T
		return zero, false
	}
}

// hold blocks until release is closed or ctx ends, bounded by blockTimeout;
// it reports whether release was closed.
func hold(ctx context.Context, release <-chan struct{}) bool {
	t := time.NewTimer(blockTimeout)
	defer t.Stop()
	select {
	case <-release:
		return true
	case <-ctx.Done():
	case <-t.C:
	}
	return false
}

// processResult is one Process call's return values, sent over a channel.
type processResult struct {
	out idem.Outcome
	err error
}

// goProcess runs c.Process in a goroutine and returns its result channel.
func (b *leaseBundle) goProcess(c *idem.LeaseConsumer, msg idem.Message, h idem.LeaseHandler) <-chan processResult {
	done := make(chan processResult, 1)
	go func() {
		out, err := c.Process(b.ctx, msg, h)
		done <- processResult{out, err}
	}()
	return done
}

// everyByte is the 256 byte values in order.
func everyByte() []byte {
	out := make([]byte, 256)
	for i := range out {
		out[i] = byte(i)
	}
	return out
}

// mib is 1 MiB of varied bytes, NULs and 0xff included.
func mib() []byte {
	out := make([]byte, 1<<20)
	x := uint32(2463534242)
	for i := range out {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		out[i] = byte(x)
	}
	return out
}

// errText is an error text with quotes, a newline and multi-byte UTF-8.
var errText = strings.Join([]string{`declined: "card_declined"`, "line 2 \u00e9\u20ac\U0001F600 \\ % _ '"}, "\n")

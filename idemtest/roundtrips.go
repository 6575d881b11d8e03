package idemtest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// CallCounter decorates a LeaseStore and counts its calls, one per
// method call whatever its outcome: the store round trips of lease mode
// as the core sees them (a store may send more than one statement in a
// call: see each store's documentation). It forwards
// idemdriver.StepRecorder unless built with hideSteps, which makes it a
// store written before that capability, and idemdriver.LeaseBatchRenewer
// (RenewBatch counts one call per batch, and its leases in Renewed).
// Safe for concurrent use.
type CallCounter struct {
	idemdriver.LeaseStore
	hideSteps bool

	acquire, renew, complete, release, saveStep, renewBatch, renewed atomic.Int64
}

// CountCalls returns a CallCounter over s; with hideSteps the counter
// hides s's StepRecorder capability.
func CountCalls(s idemdriver.LeaseStore, hideSteps bool) *CallCounter {
	return &CallCounter{LeaseStore: s, hideSteps: hideSteps}
}

// Calls is a count of lease-store calls by method. RenewBatch counts the
// idemdriver.LeaseBatchRenewer calls (one round trip each, however many
// leases they renew).
type Calls struct {
	Acquire, Renew, Complete, Release, SaveStep, RenewBatch int64
}

// Total is the sum of the calls.
func (c Calls) Total() int64 {
	return c.Acquire + c.Renew + c.Complete + c.Release + c.SaveStep + c.RenewBatch
}

// Add returns c plus d, method by method.
func (c Calls) Add(d Calls) Calls {
	return Calls{c.Acquire + d.Acquire, c.Renew + d.Renew, c.Complete + d.Complete, c.Release + d.Release, c.SaveStep + d.SaveStep, c.RenewBatch + d.RenewBatch}
}

// Sub returns c minus d, method by method.
func (c Calls) Sub(d Calls) Calls {
	return Calls{c.Acquire - d.Acquire, c.Renew - d.Renew, c.Complete - d.Complete, c.Release - d.Release, c.SaveStep - d.SaveStep, c.RenewBatch - d.RenewBatch}
}

// PerMessage lists the non-zero counts divided by n, e.g. "Acquire 1 +
// Complete 1", or "none".
func (c Calls) PerMessage(n int) string {
	s := ""
	for _, f := range []struct {
		name string
		v    int64
	}{{"Acquire", c.Acquire}, {"Renew", c.Renew}, {"RenewBatch", c.RenewBatch}, {"SaveStep", c.SaveStep}, {"Complete", c.Complete}, {"Release", c.Release}} {
		if f.v == 0 {
			continue
		}
		if s != "" {
			s += " + "
		}
		s += f.name + " " + strconv.FormatFloat(float64(f.v)/float64(n), 'g', 3, 64)
	}
	if s == "" {
		return "none"
	}
	return s
}

// Calls returns the counts so far.
func (s *CallCounter) Calls() Calls {
	return Calls{s.acquire.Load(), s.renew.Load(), s.complete.Load(), s.release.Load(), s.saveStep.Load(), s.renewBatch.Load()}
}

// Renewed is the leases renewed so far: the Renew calls that succeeded
// and the elements of RenewBatch calls that did.
func (s *CallCounter) Renewed() int64 { return s.renewed.Load() }

// RenewsBatches implements idemdriver.LeaseBatchRenewer: the wrapped
// store's answer.
func (s *CallCounter) RenewsBatches() bool {
	_, ok := idemdriver.BatchRenewer(s.LeaseStore)
	return ok
}

// RenewBatch counts one call and forwards it to the wrapped store's
// RenewBatch; over a store that does not renew in batches it is Renew of
// each element, in order (never called by a LeaseConsumer, which asks
// RenewsBatches first).
func (s *CallCounter) RenewBatch(ctx context.Context, ps []idemdriver.RenewParams) ([]error, error) {
	s.renewBatch.Add(1)
	r, ok := idemdriver.BatchRenewer(s.LeaseStore)
	if !ok {
		errs := make([]error, len(ps))
		for i := range ps {
			errs[i] = s.Renew(ctx, &ps[i])
		}
		return errs, nil
	}
	errs, err := r.RenewBatch(ctx, ps)
	for _, e := range errs {
		if e == nil {
			s.renewed.Add(1)
		}
	}
	return errs, err
}

// RecordsSteps implements idemdriver.StepRecorder: the wrapped store's
// answer, or false when the counter hides it.
func (s *CallCounter) RecordsSteps() bool {
	return !s.hideSteps && idemdriver.RecordsSteps(s.LeaseStore)
}

// Acquire counts and forwards the call.
func (s *CallCounter) Acquire(ctx context.Context, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	s.acquire.Add(1)
	return s.LeaseStore.Acquire(ctx, p)
}

// Renew counts and forwards the call.
func (s *CallCounter) Renew(ctx context.Context, p *idemdriver.RenewParams) error {
	s.renew.Add(1)
	err := s.LeaseStore.Renew(ctx, p)
	if err == nil {
		s.renewed.Add(1)
	}
	return err
}

// Complete counts and forwards the call.
func (s *CallCounter) Complete(ctx context.Context, p *idemdriver.CompleteParams) error {
	s.complete.Add(1)
	return s.LeaseStore.Complete(ctx, p)
}

// Release counts and forwards the call.
func (s *CallCounter) Release(ctx context.Context, p *idemdriver.ReleaseParams) error {
	s.release.Add(1)
	return s.LeaseStore.Release(ctx, p)
}

// SaveStep counts and forwards the call.
func (s *CallCounter) SaveStep(ctx context.Context, p *idemdriver.StepParams) error {
	s.saveStep.Add(1)
	return s.LeaseStore.SaveStep(ctx, p)
}

// RoundTrips is the store calls per message of each case of lease mode
// as the at-most-once front ends run it (idemhttp's middleware, proxy and
// Deliverer, idemgrpc): a run point recorded with the acquisition, a
// settled point with the release after a known failure.
type RoundTrips struct {
	// Messages is the number of messages of each case; the Calls are
	// totals over them (PerMessage divides).
	Messages int
	// New: a new message processed and completed (Acquire to Complete).
	New Calls
	// Duplicate: a message already completed, answered from its record.
	Duplicate Calls
	// Release: the end of an attempt that failed with a known outcome
	// (the settled point and the release), after its acquisition.
	Release Calls
	// NewTime and DuplicateTime are the wall time per message of the
	// New and Duplicate cases.
	NewTime, DuplicateTime time.Duration
}

// MeasureRoundTrips counts the store calls of n messages of each case of
// RoundTrips through a LeaseConsumer named consumer over store (wrapped in
// a CallCounter, hiding its StepRecorder capability when hideSteps, which
// gives the calls of a store without it, as every store made before it),
// one message at a time with a lease long enough that no renewal runs.
// The consumer's records are left in the store. Errors: the first
// unexpected outcome or store error.
func MeasureRoundTrips(ctx context.Context, store idemdriver.LeaseStore, consumer string, n int, hideSteps bool) (RoundTrips, error) {
	rt := RoundTrips{Messages: n}
	if n <= 0 {
		return rt, fmt.Errorf("%w: MeasureRoundTrips of %d messages", idem.ErrInvalidConfig, n)
	}
	cs := CountCalls(store, hideSteps)
	c, err := idem.NewLeaseConsumer(cs, idem.Config{Name: consumer, Lease: time.Minute, PurgeInterval: -1,
		MaxAttempts: 1 << 30, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return rt, err
	}
	defer c.Close()
	opt := idem.AcquireOptions{StepPrefix: "rt:run:"}
	msg := func(kind string, i int) idem.Message {
		return idem.Message{ID: kind + "-" + strconv.Itoa(i), Payload: []byte("payload")}
	}
	ok := func(context.Context, *idem.Attempt) (idem.Result, error) { return idem.Result{Body: []byte("ok")}, nil }

	before := cs.Calls()
	start := time.Now()
	for i := range n {
		out, err := c.ProcessWith(ctx, msg("new", i), opt, ok)
		if err != nil || out.Status != idem.Processed {
			return rt, fmt.Errorf("new message %d: %v, %w", i, out.Status, err)
		}
	}
	rt.NewTime = time.Since(start) / time.Duration(n)
	rt.New = cs.Calls().Sub(before)

	before = cs.Calls()
	start = time.Now()
	for i := range n {
		out, err := c.ProcessWith(ctx, msg("new", i), opt, ok)
		if err != nil || out.Status != idem.Duplicate {
			return rt, fmt.Errorf("duplicate %d: %v, %w", i, out.Status, err)
		}
	}
	rt.DuplicateTime = time.Since(start) / time.Duration(n)
	rt.Duplicate = cs.Calls().Sub(before)

	known := errors.New("idemtest: a known failure")
	for i := range n {
		a, out, err := c.Acquire(ctx, msg("release", i), opt)
		if a == nil {
			return rt, fmt.Errorf("release %d: not acquired: %v, %w", i, out.Status, err)
		}
		before = cs.Calls()
		if err := a.SaveStepOnRelease("rt:settled:" + strconv.FormatInt(a.Token, 10)); err != nil {
			return rt, err
		}
		if _, err := a.Release(ctx, known); !errors.Is(err, known) || errors.Is(err, idem.ErrStore) || errors.Is(err, idem.ErrLeaseLost) {
			return rt, fmt.Errorf("release %d: %w", i, err)
		}
		rt.Release = rt.Release.Add(cs.Calls().Sub(before))
	}
	return rt, nil
}

// PerMessage is c's total calls divided by the messages of each case.
func (rt RoundTrips) PerMessage(c Calls) float64 { return float64(c.Total()) / float64(rt.Messages) }

// BenchmarkRoundTrips measures lease mode's store calls per message on
// store, as MeasureRoundTrips counts them, with the store as it is
// ("after") and with its idemdriver.StepRecorder capability hidden
// ("before": the calls of a store without it, and of every store before
// the capability existed), in interleaved rounds of 20 messages per case
// under consumer names made from prefix. It reports, per message:
// new-calls, dup-calls and release-calls (after), the same with -before,
// and new-ns and new-ns-before, the wall time of a new message. Call it
// from a store's benchmark:
//
//	func BenchmarkLeaseRoundTrips(b *testing.B) { idemtest.BenchmarkRoundTrips(b, store, "bench-rt") }
func BenchmarkRoundTrips(b *testing.B, store idemdriver.LeaseStore, prefix string) {
	b.Helper()
	const round = 20
	var after, before RoundTrips
	var newT, newTBefore time.Duration
	i := 0
	for b.Loop() {
		for _, hide := range []bool{false, true} {
			i++
			rt, err := MeasureRoundTrips(b.Context(), store, prefix+"-"+newNonce()+"-"+strconv.Itoa(i), round, hide)
			if err != nil {
				b.Fatal(err)
			}
			sum := &after
			if hide {
				sum = &before
				newTBefore += rt.NewTime * round
			} else {
				newT += rt.NewTime * round
			}
			sum.Messages += rt.Messages
			sum.New, sum.Duplicate, sum.Release = sum.New.Add(rt.New), sum.Duplicate.Add(rt.Duplicate), sum.Release.Add(rt.Release)
		}
	}
	b.ReportMetric(after.PerMessage(after.New), "new-calls/msg")
	b.ReportMetric(after.PerMessage(after.Duplicate), "dup-calls/msg")
	b.ReportMetric(after.PerMessage(after.Release), "release-calls/msg")
	b.ReportMetric(before.PerMessage(before.New), "new-calls-before/msg")
	b.ReportMetric(before.PerMessage(before.Duplicate), "dup-calls-before/msg")
	b.ReportMetric(before.PerMessage(before.Release), "release-calls-before/msg")
	b.ReportMetric(float64(newT.Nanoseconds())/float64(after.Messages), "new-ns/msg")
	b.ReportMetric(float64(newTBefore.Nanoseconds())/float64(before.Messages), "new-ns-before/msg")
}

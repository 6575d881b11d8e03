package idemtest

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// HeldAttempts is what holding many lease-mode attempts at once costs
// the process, as MeasureHeldAttempts measures it.
type HeldAttempts struct {
	// Attempts is the number of attempts held at once.
	Attempts int
	// Goroutines is the process's goroutines once every attempt was
	// acquired, less those before the first (runtime.NumGoroutine; a
	// renewal in flight at that instant counts).
	Goroutines int
	// MaxGoroutines is the most goroutines more than before seen while
	// the attempts were held (sampled every 50ms, or lease/30 if shorter): renewals that were
	// in flight at once.
	MaxGoroutines int
	// LeftGoroutines is the goroutines more than before once every
	// attempt ended.
	LeftGoroutines int
	// HeapBytes is the live heap (runtime.MemStats.HeapAlloc after a
	// collection) with the attempts held, less the live heap before.
	HeapBytes int64
	// Renewals is the leases the store renewed while the attempts were
	// held (CallCounter.Renewed).
	Renewals int64
	// RenewRoundTrips is the store calls that renewed them meanwhile:
	// Renew calls plus RenewBatch calls (a store that renews in batches,
	// idemdriver.LeaseBatchRenewer, renews many leases in one).
	RenewRoundTrips int64
	// Lost is the attempts whose context ended while they were held
	// (their lease was lost or ran out by the local clock).
	Lost int
	// Held is how long every attempt was held after the last Acquire.
	Held time.Duration
}

// MeasureHeldAttempts acquires n attempts at once through a LeaseConsumer
// named consumer over store (wrapped in a CallCounter) with lease lease,
// holds them all for hold after the last Acquire, then completes each. It
// measures the process's goroutines and live heap with the attempts held
// and the renewals the consumer's scheduler sent meanwhile: renewal is
// one scheduler per consumer, so the goroutines do not grow with n (only
// a renewal in flight runs one), and each attempt is renewed about every
// lease/3. It returns an error when an Acquire or a Complete fails.
func MeasureHeldAttempts(ctx context.Context, store idemdriver.LeaseStore, consumer string, n int, lease, hold time.Duration) (HeldAttempts, error) {
	cs := CountCalls(store, false)
	c, err := idem.NewLeaseConsumer(cs, idem.Config{Name: consumer, Lease: lease, PurgeInterval: -1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return HeldAttempts{}, err
	}
	defer func() { _ = c.Close() }()
	h := HeldAttempts{Attempts: n}
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	heap0, g0 := int64(ms.HeapAlloc), runtime.NumGoroutine()
	held := make([]*idem.Attempt, 0, n)
	defer func() {
		for _, a := range held {
			_, _ = a.Abandon(ctx, nil) // a no-op for the completed ones
		}
	}()
	payload := []byte("payload")
	for i := range n {
		a, out, err := c.Acquire(ctx, idem.Message{ID: "held-" + strconv.Itoa(i), Payload: payload}, idem.AcquireOptions{})
		if a == nil {
			return h, fmt.Errorf("acquire %d of %d: %v: %w", i, n, out.Status, err)
		}
		held = append(held, a)
	}
	h.Goroutines = runtime.NumGoroutine() - g0
	runtime.GC()
	runtime.ReadMemStats(&ms)
	h.HeapBytes = int64(ms.HeapAlloc) - heap0
	renews0, calls0 := cs.Renewed(), cs.Calls()
	start := time.Now()
	tick := time.NewTicker(min(lease/30, 50*time.Millisecond))
	for time.Since(start) < hold {
		h.MaxGoroutines = max(h.MaxGoroutines, runtime.NumGoroutine()-g0)
		<-tick.C
	}
	tick.Stop()
	h.Held = time.Since(start)
	h.Renewals = cs.Renewed() - renews0
	calls := cs.Calls().Sub(calls0)
	h.RenewRoundTrips = calls.Renew + calls.RenewBatch
	for _, a := range held {
		if a.Context().Err() != nil {
			h.Lost++
		}
	}
	for i, a := range held {
		if out, err := a.Complete(ctx, idem.Result{Body: []byte("ok")}); err != nil && a.Context().Err() == nil {
			return h, fmt.Errorf("complete %d of %d: %v: %w", i, n, out.Status, err)
		}
	}
	held = nil
	// The last renewals in flight return (Complete waits for them); the
	// scheduler's timer stays, stopped.
	h.LeftGoroutines = runtime.NumGoroutine() - g0
	return h, nil
}

// BenchmarkHeldAttempts runs MeasureHeldAttempts once per iteration with
// n attempts on store (consumer names made from prefix) with lease lease,
// each held for hold after the last Acquire, and reports the last run's counts:
// attempts, goroutines (once all are held), max-goroutines (while held),
// left-goroutines (after they ended), heap-B/attempt, renewals/attempt,
// renew-round-trips/lease (the store calls that renewed them, per lease
// of holding) and lost. Call it from a store's benchmark:
//
//	func BenchmarkHeldAttempts(b *testing.B) {
//		idemtest.BenchmarkHeldAttempts(b, store, "bench-held", 10000, 30*time.Second, 12*time.Second)
//	}
//
// The lease must outlast the n Acquires and the renewals of n attempts
// every lease/3 must fit the store's rate: lost counts the attempts whose
// lease ran out meanwhile.
func BenchmarkHeldAttempts(b *testing.B, store idemdriver.LeaseStore, prefix string, n int, lease, hold time.Duration) {
	b.Helper()
	var h HeldAttempts
	i := 0
	for b.Loop() {
		i++
		var err error
		h, err = MeasureHeldAttempts(b.Context(), store, prefix+"-"+newNonce()+"-"+strconv.Itoa(i), n, lease, hold)
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(h.Attempts), "attempts")
	b.ReportMetric(float64(h.Goroutines), "goroutines")
	b.ReportMetric(float64(h.MaxGoroutines), "max-goroutines")
	b.ReportMetric(float64(h.LeftGoroutines), "left-goroutines")
	b.ReportMetric(float64(h.HeapBytes)/float64(h.Attempts), "heap-B/attempt")
	b.ReportMetric(float64(h.Renewals)/float64(h.Attempts), "renewals/attempt")
	b.ReportMetric(float64(h.RenewRoundTrips)/(float64(h.Held)/float64(lease)), "renew-round-trips/lease")
	b.ReportMetric(float64(h.Lost), "lost")
}

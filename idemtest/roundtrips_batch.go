package idemtest

import (
	"context"
	"sync/atomic"

	"github.com/idem-go/idem/idemdriver"
)

// BatchCounter is a CallCounter over an idemdriver.LeaseBatcher that is
// one itself: it also counts the AcquireBatch and CompleteBatch calls (one
// round trip each, however many elements), forwarded to the wrapped
// store. The single calls are counted by the CallCounter (Calls). Safe
// for concurrent use.
type BatchCounter struct {
	*CallCounter
	b                           idemdriver.LeaseBatcher
	acquireBatch, completeBatch atomic.Int64
}

// CountBatches returns a BatchCounter over b; with hideSteps the counter
// hides b's StepRecorder capability (see CountCalls).
func CountBatches(b idemdriver.LeaseBatcher, hideSteps bool) *BatchCounter {
	return &BatchCounter{CallCounter: CountCalls(b, hideSteps), b: b}
}

// Batches returns the AcquireBatch and CompleteBatch calls so far.
func (s *BatchCounter) Batches() (acquire, complete int64) {
	return s.acquireBatch.Load(), s.completeBatch.Load()
}

// AcquireBatch counts one call and forwards it.
func (s *BatchCounter) AcquireBatch(ctx context.Context, ps []*idemdriver.AcquireParams) ([]idemdriver.AcquireResult, []error, error) {
	s.acquireBatch.Add(1)
	return s.b.AcquireBatch(ctx, ps)
}

// CompleteBatch counts one call and forwards it.
func (s *BatchCounter) CompleteBatch(ctx context.Context, ps []*idemdriver.CompleteParams) ([]error, error) {
	s.completeBatch.Add(1)
	return s.b.CompleteBatch(ctx, ps)
}

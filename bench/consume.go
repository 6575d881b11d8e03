package main

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
)

// runStats counts the acknowledged deliveries of one run and keeps their
// latencies: from the moment a worker starts handling the delivery (or the
// batch holding it) to its ack.
type runStats struct {
	target  int64
	acked   atomic.Int64
	reached chan struct{}
	first   atomic.Int64 // UnixNano of the first delivery handled
	last    atomic.Int64 // UnixNano of the ack that reached target

	mu  sync.Mutex
	lat []time.Duration
}

func newRunStats(target int) *runStats {
	return &runStats{target: int64(target), reached: make(chan struct{}), lat: make([]time.Duration, 0, max(target, 0))}
}

// started notes the start of handling a delivery.
func (s *runStats) started(t time.Time) { s.first.CompareAndSwap(0, t.UnixNano()) }

// acked records one acknowledged delivery whose handling started at start.
func (s *runStats) ack(start time.Time) {
	now := time.Now()
	s.mu.Lock()
	s.lat = append(s.lat, now.Sub(start))
	s.mu.Unlock()
	if s.acked.Add(1) == s.target {
		s.last.Store(now.UnixNano())
		close(s.reached)
	}
}

// elapsed is the time from the first delivery handled to the ack that
// reached the target.
func (s *runStats) elapsed() time.Duration {
	return time.Duration(s.last.Load() - s.first.Load())
}

// loopConfig shapes a member's consumption loop.
type loopConfig struct {
	workers    int           // deliveries (or batches) handled at once
	fetchMax   int           // most deliveries per fetch
	chunk      int           // deliveries per unit of work: 1, or the batch size
	retryDelay time.Duration // before a failed delivery is tried again
}

// work handles one unit (one delivery, or a batch) and says which
// deliveries may be acknowledged.
type work func(ctx context.Context, ds []delivery) []bool

func perMessage(h msgHandler) work {
	return func(ctx context.Context, ds []delivery) []bool {
		acks := make([]bool, len(ds))
		for i, d := range ds {
			acks[i], _ = h(ctx, idem.Message{ID: d.id, Payload: d.payload})
		}
		return acks
	}
}

func perBatch(h batchHandler) work {
	return func(ctx context.Context, ds []delivery) []bool {
		msgs := make([]idem.Message, len(ds))
		for i, d := range ds {
			msgs[i] = idem.Message{ID: d.id, Payload: d.payload}
		}
		return h(ctx, msgs)
	}
}

// consume runs member m: deliveries are split into units of cfg.chunk
// handled by cfg.workers goroutines (see pipeline); each delivery its unit
// says may be acknowledged is acked, the others retried (in place, or by a
// nak for a delayed redelivery). It returns nil when ctx ends, and
// errCrashed when the crash fault killed the member: the delivery that
// triggered it was committed and is never acknowledged, and neither is
// anything else the member still held.
func consume(ctx context.Context, ch channel, m member, w work, cfg loopConfig, f *faults, st *runStats) error {
	hctx := context.WithoutCancel(ctx) // a handler in flight finishes its transaction
	var crashed atomic.Bool
	handle := func(unit []delivery) {
		for len(unit) > 0 && !crashed.Load() {
			start := time.Now()
			st.started(start)
			acks := w(hctx, unit)
			var again []delivery
			for i, d := range unit {
				switch {
				case crashed.Load():
					return
				case acks[i]:
					if f.crashNow(d.id) {
						if !crashed.Swap(true) {
							m.crash()
						}
						return
					}
					if d.ack() == nil {
						st.ack(start)
					}
				case ch.retryInPlace():
					again = append(again, d)
				default:
					_ = d.nak(cfg.retryDelay)
				}
			}
			if len(again) > 0 {
				select {
				case <-time.After(cfg.retryDelay):
				case <-ctx.Done():
					return
				}
			}
			unit = again
		}
	}
	return pipeline(ctx, m, cfg, &crashed, handle)
}

// pipeline fetches from m without waiting for earlier fetches to be
// handled: each fetch is split into units of cfg.chunk deliveries, handed to
// cfg.workers goroutines running handle, and committed (Kafka) once all of
// its units are handled, in fetch order, so a commit never skips a record
// still being handled. Fetching ahead is bounded by the workers and a short
// queue of fetches awaiting their commit. It returns errCrashed once crashed
// is set (nothing more is committed), and nil when ctx ends, after the
// units in flight are handled and committed.
func pipeline(ctx context.Context, m member, cfg loopConfig, crashed *atomic.Bool, handle func([]delivery)) error {
	hctx := context.WithoutCancel(ctx)
	type fetched struct {
		ds   []delivery
		done *sync.WaitGroup
	}
	toCommit := make(chan fetched, 2)
	committed := make(chan struct{})
	go func() {
		defer close(committed)
		for f := range toCommit {
			f.done.Wait()
			if !crashed.Load() {
				_ = m.commit(hctx, f.ds)
			}
		}
	}()
	type job struct {
		unit []delivery
		done *sync.WaitGroup
	}
	units := make(chan job)
	var workers sync.WaitGroup
	for range cfg.workers {
		workers.Go(func() {
			for j := range units {
				handle(j.unit)
				j.done.Done()
			}
		})
	}
	defer func() {
		close(units)
		workers.Wait()
		close(toCommit)
		<-committed
	}()
	for ctx.Err() == nil && !crashed.Load() {
		ds, err := m.fetch(ctx, cfg.fetchMax)
		if crashed.Load() || errors.Is(err, errCrashed) {
			return errCrashed
		}
		if err != nil || len(ds) == 0 {
			select { // nothing yet, or a broker hiccup: try again shortly
			case <-time.After(5 * time.Millisecond):
			case <-ctx.Done():
			}
			continue
		}
		done := &sync.WaitGroup{}
		n := (len(ds) + cfg.chunk - 1) / cfg.chunk
		done.Add(n)
		for i := 0; i < len(ds); i += cfg.chunk {
			units <- job{ds[i:min(i+cfg.chunk, len(ds)):min(i+cfg.chunk, len(ds))], done}
		}
		toCommit <- fetched{ds, done}
	}
	if crashed.Load() {
		return errCrashed
	}
	return nil
}

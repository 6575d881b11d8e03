package idem

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/idem-go/idem/idemdriver"
)

// Retention
//
// A processed record is deleted only after its consumer has been running
// for at least the retention window since the record was written. Time in
// which the consumer was not running does not count: not the downtime
// itself, and not when new messages arrive after the restart, and not
// whichever process (the consumer's own purge loop, `idem purge`, another
// replica) runs the purge. So the redeliveries of a downtime (uncommitted
// Kafka offsets, unacked JetStream messages, pending Redis entries) find
// their records however long the downtime lasted.
//
// A running Consumer or LeaseConsumer records that it runs
// (idemdriver.Retainer.MarkRunning) when it starts and then every
// heartbeat, by the store's clock; a run is the span from a start to the
// last heartbeat before the consumer stopped, crashed or stalled. The
// purge sums the consumer's runs backwards from the newest; the horizon is
// the moment from which they add up to the window, and records written
// before it go.

// PurgeParams controls one purge of a consumer's processed records; see
// [Purge].
type PurgeParams struct {
	// Consumer is the consumer whose records are purged.
	Consumer string
	// RetentionWindow is how long, in running time of the consumer, a
	// record is kept. In 1ns..MaxRetentionWindow.
	RetentionWindow time.Duration
	// BatchSize is the most records one batch deletes, each batch in its
	// own short transaction so the inbox keeps flowing. Positive.
	BatchSize int
	// DryRun counts the records a purge would delete now and deletes
	// nothing.
	DryRun bool
	// OnBatch, if set, is called after each batch with the number of
	// records deleted so far; it must be fast.
	OnBatch func(deletedSoFar int64)
	// StoreTimeout bounds each store call of the purge (taking the lock,
	// reading the runs, each batch, releasing the lock): past it the purge
	// stops with an error matching ErrStore and ErrStoreTimeout, having
	// deleted the batches already run. Defaults to DefaultStoreTimeout; a
	// negative value leaves the calls bounded by ctx alone. A consumer's
	// own purges use its Config.StoreTimeout.
	StoreTimeout time.Duration
	// DutyCycle is the most of the purge's elapsed time its batches may
	// take, a fraction in (0, 1]: after a batch that took d (the store
	// call's round trip), the purge pauses d×(1−DutyCycle)/DutyCycle
	// before the next one, so it keeps at most that share of one
	// connection busy, and slows down by itself when the server is busy
	// or slow (its batches take longer). 1 runs the batches back to back.
	// No pause follows the last batch, and DryRun never pauses. Zero
	// means DefaultPurgeDutyCycle; a negative value, NaN or one above 1
	// returns an error matching ErrInvalidConfig. A consumer's own purges
	// use its Config.PurgeDutyCycle. The purge lock is held through the
	// pauses: on PostgreSQL by a transaction that sits idle for about
	// d/DutyCycle between batches (a batch's own transaction runs on
	// another connection). That transaction sets its own
	// idle_in_transaction_session_timeout, one hour (SET LOCAL), so the
	// server's or the session's setting, however short, does not end it
	// during a pause; only a batch and its pause lasting longer than the
	// hour would (the server then ends the lock, and the purge stops with
	// an error matching ErrStore before its next batch, the batches run so
	// far deleted).
	DutyCycle float64
}

// PurgeResult reports one purge.
type PurgeResult struct {
	// Deleted is the number of records deleted (or, with DryRun, that
	// would be).
	Deleted int64
	// Batches is the number of batches run (with DryRun, 1 when there is
	// anything to delete).
	Batches int
	// Horizon is the cut-off, by the store's clock: records written
	// before it were deleted. Zero when the consumer has not yet run for
	// the window, so nothing may go.
	Horizon time.Time
	// Paused is the time the purge spent pausing between batches to keep
	// to its DutyCycle (a pause cut short by ctx counted as far as it
	// went); the rest of its duration is the store's.
	Paused time.Duration
}

// Purge deletes consumer p.Consumer's completed and failed records that
// its consumer has outrun by p.RetentionWindow of running time (see the
// package doc, Retention), in batches of at most p.BatchSize, oldest
// first. in_progress lease records are never deleted.
//
// One cleaner runs at a time per consumer: Purge returns an error matching
// [ErrPurgeInProgress] at once when another holds the store's purge lock.
// Cancelling ctx stops it between or during batches; the batches already
// run stay deleted and are counted in the result; a cancellation during a
// pause between batches (see PurgeParams.DutyCycle) ends it at once.
// Invalid parameters
// return an error matching [ErrInvalidConsumerName] or [ErrInvalidConfig];
// a failure of the store one matching [ErrStore].
//
// Consumer.Purge and LeaseConsumer.Purge call it with their own settings;
// it is exported for tools that purge without running the consumer, such
// as `idem purge`.
func Purge(ctx context.Context, store idemdriver.Retainer, p PurgeParams) (PurgeResult, error) {
	var res PurgeResult
	if err := validatePurge(&p); err != nil {
		return res, err
	}
	d := p.StoreTimeout
	if d == 0 {
		d = DefaultStoreTimeout
	}
	// call runs one store call of the purge under the store timeout.
	call := func(fn func(ctx context.Context) error) error {
		cctx, cancel := callCtx(ctx, max(d, 0))
		defer cancel()
		return timedOut(cctx, fn(cctx))
	}
	var s idemdriver.PurgeSession
	err := call(func(ctx context.Context) (err error) {
		s, err = store.BeginPurge(ctx, &idemdriver.BeginPurgeParams{Consumer: p.Consumer})
		return err
	})
	if errors.Is(err, ErrPurgeInProgress) {
		return res, err
	}
	if err != nil {
		return res, storeError("purge lock", err)
	}
	defer func() {
		cctx, cancel := detachedCallCtx(ctx, max(d, 0))
		defer cancel()
		_ = s.Close(cctx) // a lock that cannot be released ends with its session
	}()
	var runs []idemdriver.Run
	err = call(func(ctx context.Context) (err error) { runs, err = s.Runs(ctx); return err })
	if err != nil {
		return res, storeError("purge runs", err)
	}
	res.Horizon = RetentionHorizon(runs, p.RetentionWindow)
	if res.Horizon.IsZero() {
		return res, nil
	}
	if p.DryRun {
		var n int64
		err := call(func(ctx context.Context) (err error) { n, err = s.CountBefore(ctx, res.Horizon); return err })
		if err != nil {
			return res, storeError("purge count", err)
		}
		if res.Deleted = n; n > 0 {
			res.Batches = 1
			if p.OnBatch != nil {
				p.OnBatch(n)
			}
		}
		return res, nil
	}
	batch := &idemdriver.PurgeBatchParams{Horizon: res.Horizon, Limit: p.BatchSize}
	var pause time.Duration // owed by the previous batch
	for {
		if pause > 0 {
			t0 := time.Now()
			err := sleepCtx(ctx, pause)
			res.Paused += time.Since(t0)
			if err != nil {
				return res, err
			}
		}
		if err := ctx.Err(); err != nil {
			return res, err
		}
		var n int64
		start := time.Now()
		err := call(func(ctx context.Context) (err error) { n, err = s.DeleteBatch(ctx, batch); return err })
		pause = dutyPause(time.Since(start), p.DutyCycle)
		if err != nil {
			if ctx.Err() != nil {
				return res, ctx.Err()
			}
			return res, storeError("purge batch", err)
		}
		if n > 0 {
			res.Deleted += n
			res.Batches++
			if p.OnBatch != nil {
				p.OnBatch(res.Deleted)
			}
		}
		if n < int64(p.BatchSize) {
			break
		}
	}
	if err := call(func(ctx context.Context) error { return s.PruneRuns(ctx, res.Horizon) }); err != nil {
		return res, storeError("purge runs", err)
	}
	return res, nil
}

// RetentionHorizon returns the purge horizon of a consumer with the given
// runs (in any order, possibly overlapping, as several processes of one
// consumer record them) and retention window: the latest moment since
// which the consumer has been running for window, summing the union of the
// runs backwards from the newest end. It is zero when the runs add up to
// less than window, so that nothing may be deleted yet. Records written
// before the horizon may go.
func RetentionHorizon(runs []idemdriver.Run, window time.Duration) time.Time {
	rs := slices.Clone(runs)
	slices.SortFunc(rs, func(a, b idemdriver.Run) int { return a.Start.Compare(b.Start) })
	var merged []idemdriver.Run
	for _, r := range rs {
		if r.End.Before(r.Start) {
			r.End = r.Start
		}
		if n := len(merged); n > 0 && !r.Start.After(merged[n-1].End) {
			if r.End.After(merged[n-1].End) {
				merged[n-1].End = r.End
			}
			continue
		}
		merged = append(merged, r)
	}
	var ran time.Duration
	for i := len(merged) - 1; i >= 0; i-- {
		d := merged[i].End.Sub(merged[i].Start)
		if ran+d >= window {
			return merged[i].End.Add(-(window - ran))
		}
		ran += d
	}
	return time.Time{}
}

// dutyPause is the pause owed after a batch that took took, so that the
// batches take at most share of the purge's time.
func dutyPause(took time.Duration, share float64) time.Duration {
	if share >= 1 || took <= 0 {
		return 0
	}
	return time.Duration(math.Round(float64(took) * (1 - share) / share))
}

// sleepCtx waits d, or until ctx ends, when it returns ctx's error.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// validatePurge checks p's consumer name, window, batch size and duty
// cycle, and sets a zero duty cycle to the default.
func validatePurge(p *PurgeParams) error {
	if err := ValidateConsumerName(p.Consumer); err != nil {
		return err
	}
	if p.RetentionWindow <= 0 || p.RetentionWindow > MaxRetentionWindow {
		return fmt.Errorf("%w: RetentionWindow %v not in 1ns..%v", ErrInvalidConfig, p.RetentionWindow, MaxRetentionWindow)
	}
	if p.BatchSize <= 0 {
		return fmt.Errorf("%w: purge BatchSize %d, want a positive number", ErrInvalidConfig, p.BatchSize)
	}
	if p.DutyCycle == 0 {
		p.DutyCycle = DefaultPurgeDutyCycle
	}
	return validDutyCycle(p.DutyCycle)
}

// validDutyCycle refuses a purge duty cycle outside (0, 1].
func validDutyCycle(share float64) error {
	if math.IsNaN(share) || share <= 0 || share > 1 {
		return fmt.Errorf("%w: purge duty cycle %v not in (0, 1]", ErrInvalidConfig, share)
	}
	return nil
}

// finishTimeout bounds the cleanup run on a detached context after the
// caller's context ended: a rollback, releasing a purge lock.
const finishTimeout = 10 * time.Second

// heartbeat returns how often a consumer with the given retention window
// marks itself running: a tenth of the window, between 1s and 1m, so a
// stall or a crash costs at most that much of counted running time.
func heartbeat(window time.Duration) time.Duration {
	return min(time.Minute, max(time.Second, window/10))
}

// runLoop marks the consumer running now (a new run) and then every
// heartbeat, extending the run while the heartbeats keep coming: a
// heartbeat later than three intervals (a stall, a long pause, a store
// outage) starts a new run, so the gap is not counted as running.
func (c *core) runLoop(ctx context.Context) {
	defer c.loops.Done()
	c.warnFailoverRisk(ctx)
	beat := heartbeat(c.cfg.RetentionWindow)
	var gap time.Duration // zero until the first mark of this process lands
	t := time.NewTicker(beat)
	defer t.Stop()
	for ctx.Err() == nil {
		// A mark in flight when Close comes is let finish (bounded), rather
		// than cancelled mid-statement, which would cost the store its
		// connection. It is bounded by the store timeout, not by the beat:
		// a mark that lands late still starts or extends a run (the store
		// judges the gap by its own clock when the mark arrives), whereas
		// one cut off at the beat on a slow store records nothing at all.
		mctx, cancel := detachedCallCtx(ctx, c.storeTimeout())
		err := timedOut(mctx, c.store.MarkRunning(mctx, &idemdriver.MarkRunningParams{Consumer: c.cfg.Name, MaxGap: gap}))
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			err = c.storeErr(ctx, "mark-running", "", err)
			c.cfg.Logger.Warn("idem: could not record that the consumer is running", "consumer", c.cfg.Name, "err", err)
		} else {
			gap = 3 * beat
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// purgeNow runs one purge of this consumer with the configured window and
// pacing, and returns with its result the span by which it moved the
// horizon since this process's previous purge (PurgeEvent.Span).
func (c *core) purgeNow(ctx context.Context) (PurgeResult, time.Duration, error) {
	start := time.Now()
	res, err := Purge(ctx, c.store, PurgeParams{
		Consumer:        c.cfg.Name,
		RetentionWindow: c.cfg.RetentionWindow,
		BatchSize:       c.cfg.PurgeBatchSize,
		StoreTimeout:    c.cfg.StoreTimeout,
		DutyCycle:       c.cfg.PurgeDutyCycle,
	})
	took := time.Since(start)
	if err != nil && !errors.Is(err, ErrPurgeInProgress) {
		err = c.storeErr(ctx, "purge", "", err)
	}
	var span time.Duration
	if err == nil && !res.Horizon.IsZero() {
		c.purgeMu.Lock()
		if !c.lastHorizon.IsZero() {
			span = max(0, res.Horizon.Sub(c.lastHorizon))
		}
		if res.Horizon.After(c.lastHorizon) {
			c.lastHorizon = res.Horizon
		}
		c.purgeMu.Unlock()
	}
	if h := c.hooks; h != nil && len(h.purge) > 0 {
		e := PurgeEvent{Consumer: c.cfg.Name, Result: res, RetentionWindow: c.cfg.RetentionWindow, Latency: took, Span: span, Err: err}
		if err == nil && !res.Horizon.IsZero() {
			e.Lag = max(0, time.Since(res.Horizon)-c.cfg.RetentionWindow)
		}
		for _, x := range h.purge {
			h.safe(x, func() { x.OnPurge(ctx, e) })
		}
	}
	return res, span, err
}

// purgeLoop purges every PurgeInterval, with ±10% jitter so a fleet of
// consumers does not purge in step. A purge that took as long as the span
// of records it deleted (PurgeEvent.Span) is logged at warn: it deletes
// more slowly than records become purgeable.
func (c *core) purgeLoop(ctx context.Context) {
	defer c.loops.Done()
	log := c.cfg.Logger.With("consumer", c.cfg.Name)
	for {
		d := c.cfg.PurgeInterval + time.Duration((rand.Float64()-0.5)*0.2*float64(c.cfg.PurgeInterval))
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		start := time.Now()
		res, span, err := c.purgeNow(ctx)
		took := time.Since(start)
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, ErrPurgeInProgress):
			log.Debug("idem: purge skipped, another cleaner is running")
		case err != nil:
			log.Warn("idem: purge failed", "err", err)
		case span > 0 && res.Deleted > 0 && took >= span:
			log.Warn("idem: purge is falling behind: it took longer than the span of records it deleted; raise PurgeDutyCycle",
				"deleted", res.Deleted, "batches", res.Batches, "horizon", res.Horizon, "span", span,
				"duration", took, "paused", res.Paused, "duty_cycle", c.cfg.PurgeDutyCycle)
		default:
			log.Info("idem: purge done", "deleted", res.Deleted, "batches", res.Batches,
				"horizon", res.Horizon, "duration", took, "paused", res.Paused)
		}
	}
}

package idemtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// elapse makes d of running time pass for consumer, whose Consumer and
// LeaseConsumer values must all be closed (so no heartbeat of theirs runs
// in between): a run starts now (a consumer closed at once may not have
// recorded its own), everything the store recorded for consumer moves back
// by d (Shift), then that run is extended to now, as the heartbeats of a
// consumer that kept running would have done.
func elapse(t *testing.T, ctx context.Context, store idemdriver.Retainer, shift func(context.Context, string, time.Duration) error, consumer string, d time.Duration) {
	t.Helper()
	if err := store.MarkRunning(ctx, &idemdriver.MarkRunningParams{Consumer: consumer}); err != nil {
		t.Fatalf("MarkRunning(%q, MaxGap 0): %v", consumer, err)
	}
	if err := shift(ctx, consumer, d); err != nil {
		t.Fatalf("Shift(%q, %v): %v", consumer, d, err)
	}
	if err := store.MarkRunning(ctx, &idemdriver.MarkRunningParams{Consumer: consumer, MaxGap: d + horizonSlack}); err != nil {
		t.Fatalf("MarkRunning(%q, MaxGap %v): %v", consumer, d+horizonSlack, err)
	}
}

// downtime makes d pass for consumer without it running: everything the
// store recorded for consumer moves back by d, and no run is extended.
func downtime(t *testing.T, ctx context.Context, shift func(context.Context, string, time.Duration) error, consumer string, d time.Duration) {
	t.Helper()
	if err := shift(ctx, consumer, d); err != nil {
		t.Fatalf("Shift(%q, %v): %v", consumer, d, err)
	}
}

// purgeWith runs idem.Purge on store for consumer, as `idem purge` does
// from a process that is not the consumer.
func purgeWith(ctx context.Context, store idemdriver.Retainer, consumer string, win time.Duration, batchSize int, dryRun bool, onBatch func(int64)) (idem.PurgeResult, error) {
	return idem.Purge(ctx, store, idem.PurgeParams{
		Consumer:        consumer,
		RetentionWindow: win,
		BatchSize:       batchSize,
		DryRun:          dryRun,
		OnBatch:         onBatch,
	})
}

// wantHorizonNear checks a purge horizon against the wall-clock moment
// want, within horizonSlack (the store's clock is the server's).
func wantHorizonNear(t *testing.T, what string, got, want time.Time) {
	t.Helper()
	if d := got.Sub(want); got.IsZero() || d > horizonSlack || d < -horizonSlack {
		t.Errorf("%s: Horizon = %v, want about %v", what, got, want)
	}
}

// retainerCases exercise the Retainer primitives directly: runs, the purge
// lock, batch bounds and validation.
func retainerCases(t *testing.T, ctx context.Context, store idemdriver.Retainer, consumer string) {
	t.Helper()
	mark := func(gap time.Duration) {
		t.Helper()
		if err := store.MarkRunning(ctx, &idemdriver.MarkRunningParams{Consumer: consumer, MaxGap: gap}); err != nil {
			t.Fatalf("MarkRunning(MaxGap %v): %v", gap, err)
		}
	}
	runs := func(what string) []idemdriver.Run {
		t.Helper()
		s, err := store.BeginPurge(ctx, &idemdriver.BeginPurgeParams{Consumer: consumer})
		if err != nil {
			t.Fatalf("%s: BeginPurge: %v", what, err)
		}
		defer s.Close(ctx)
		rs, err := s.Runs(ctx)
		if err != nil {
			t.Fatalf("%s: Runs: %v", what, err)
		}
		for i, r := range rs {
			if r.End.Before(r.Start) {
				t.Errorf("%s: run %d ends (%v) before it starts (%v)", what, i, r.End, r.Start)
			}
			if i > 0 && r.Start.Before(rs[i-1].Start) {
				t.Errorf("%s: runs not oldest first: %v after %v", what, r.Start, rs[i-1].Start)
			}
		}
		return rs
	}
	if rs := runs("before any MarkRunning"); len(rs) != 0 {
		t.Errorf("before any MarkRunning: %d runs, want none", len(rs))
	}
	mark(0)
	mark(time.Hour) // extends
	if rs := runs("after MarkRunning(0) and MarkRunning(1h)"); len(rs) != 1 {
		t.Errorf("after MarkRunning(0) then MarkRunning(1h): %d runs, want 1 (the second extends the first)", len(rs))
	}
	// A restart is a new run, unless it comes in the same tick of the
	// store's clock as the newest run's start (SQLite's clock counts
	// milliseconds), where both are one span of running time, which
	// starts and ends in that tick: mark again until the clock has moved
	// on, when the restart must start a run of its own.
	mark(0)
	rs := runs("after a second MarkRunning(0)")
	for deadline := time.Now().Add(realTimeout); len(rs) == 1 && rs[0].End.Equal(rs[0].Start) && time.Now().Before(deadline); {
		mark(0)
		rs = runs("after a second MarkRunning(0)")
	}
	if len(rs) != 2 {
		t.Fatalf("after a second MarkRunning(0): %d runs, want 2 (MaxGap 0 starts a new run)", len(rs))
	}
	if rs[1].Start.Before(rs[0].End) {
		t.Errorf("the second run starts (%v) before the first ends (%v)", rs[1].Start, rs[0].End)
	}

	// PruneRuns drops the runs that ended before t, and only those.
	s, err := store.BeginPurge(ctx, &idemdriver.BeginPurgeParams{Consumer: consumer})
	if err != nil {
		t.Fatalf("BeginPurge: %v", err)
	}
	if _, err := store.BeginPurge(ctx, &idemdriver.BeginPurgeParams{Consumer: consumer}); !errors.Is(err, idemdriver.ErrPurgeInProgress) {
		t.Errorf("a second BeginPurge while a session is open: err = %v, want ErrPurgeInProgress", err)
	}
	if err := s.PruneRuns(ctx, rs[1].Start); err != nil {
		t.Fatalf("PruneRuns: %v", err)
	}
	for _, tt := range []struct {
		name string
		err  error
	}{
		{"DeleteBatch with a zero horizon", func() error {
			_, err := s.DeleteBatch(ctx, &idemdriver.PurgeBatchParams{Limit: 10})
			return err
		}()},
		{"DeleteBatch with a zero limit", func() error {
			_, err := s.DeleteBatch(ctx, &idemdriver.PurgeBatchParams{Horizon: time.Now(), Limit: 0})
			return err
		}()},
		{"CountBefore with a zero horizon", func() error {
			_, err := s.CountBefore(ctx, time.Time{})
			return err
		}()},
	} {
		if !errors.Is(tt.err, idemdriver.ErrInvalidConfig) {
			t.Errorf("%s: err = %v, want an error matching ErrInvalidConfig", tt.name, tt.err)
		}
	}
	if err := s.Close(ctx); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := s.Close(ctx); err != nil {
		t.Errorf("a second Close: %v, want nil", err)
	}
	// The first run is pruned if it ended strictly before the second began
	// (a store clock coarser than the calls' spacing may make them touch).
	want := 1
	if !rs[0].End.Before(rs[1].Start) {
		want = 2
	}
	if got := runs("after PruneRuns"); len(got) != want {
		t.Errorf("after PruneRuns(the second run's start): %d runs, want %d (runs were %v)", len(got), want, rs)
	}

	for _, tt := range []struct {
		name string
		err  error
		want error
	}{
		{"MarkRunning with an empty consumer", store.MarkRunning(ctx, &idemdriver.MarkRunningParams{}), idemdriver.ErrInvalidConsumerName},
		{"MarkRunning with a negative MaxGap", store.MarkRunning(ctx, &idemdriver.MarkRunningParams{Consumer: consumer, MaxGap: -1}), idemdriver.ErrInvalidConfig},
		{"BeginPurge with a control character", func() error {
			s, err := store.BeginPurge(ctx, &idemdriver.BeginPurgeParams{Consumer: "a\x00b"})
			if err == nil {
				s.Close(ctx)
			}
			return err
		}(), idemdriver.ErrInvalidConsumerName},
	} {
		if !errors.Is(tt.err, tt.want) {
			t.Errorf("%s: err = %v, want an error matching %v", tt.name, tt.err, tt.want)
		}
	}
}

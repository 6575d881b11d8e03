package idem_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// pacedStore is a Retainer holding n records of consumer "c", all past the
// horizon of a one-hour window, whose batches take the durations in took
// (the last one repeated) on the bubble's clock. It records when each
// batch started.
type pacedStore struct {
	mu     sync.Mutex
	n      int64
	took   []time.Duration
	starts []time.Time
}

func (s *pacedStore) MarkRunning(context.Context, *idemdriver.MarkRunningParams) error { return nil }

func (s *pacedStore) BeginPurge(context.Context, *idemdriver.BeginPurgeParams) (idemdriver.PurgeSession, error) {
	return pacedSession{s}, nil
}

type pacedSession struct{ s *pacedStore }

func (p pacedSession) Runs(context.Context) ([]idemdriver.Run, error) {
	now := time.Now()
	return []idemdriver.Run{{Start: now.Add(-2 * time.Hour), End: now}}, nil
}

func (p pacedSession) CountBefore(context.Context, time.Time) (int64, error) {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	return p.s.n, nil
}

func (p pacedSession) DeleteBatch(ctx context.Context, b *idemdriver.PurgeBatchParams) (int64, error) {
	p.s.mu.Lock()
	i := len(p.s.starts)
	p.s.starts = append(p.s.starts, time.Now())
	d := p.s.took[min(i, len(p.s.took)-1)]
	p.s.mu.Unlock()
	time.Sleep(d)
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	n := min(p.s.n, int64(b.Limit))
	p.s.n -= n
	return n, nil
}

func (p pacedSession) PruneRuns(context.Context, time.Time) error { return nil }
func (p pacedSession) Close(context.Context) error                { return nil }

// gaps returns the time between consecutive batch starts.
func (s *pacedStore) gaps() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	var g []time.Duration
	for i := 1; i < len(s.starts); i++ {
		g = append(g, s.starts[i].Sub(s.starts[i-1]))
	}
	return g
}

// A paced purge pauses d×(1−share)/share after a batch that took d, so
// its batches take share of its time; a slower batch earns a longer
// pause; no pause follows the last batch; DutyCycle 1 never pauses and
// zero means DefaultPurgeDutyCycle.
func TestPurgeDutyCycle(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	for _, tt := range []struct {
		name   string
		share  float64
		took   []time.Duration
		gaps   []time.Duration // between batch starts: a batch and its pause
		paused time.Duration
	}{
		{"a fifth", 0.2, []time.Duration{100 * ms}, []time.Duration{500 * ms, 500 * ms, 500 * ms}, 1200 * ms},
		{"the default", 0, []time.Duration{100 * ms}, []time.Duration{500 * ms, 500 * ms, 500 * ms}, 1200 * ms},
		{"half, batches slowing down", 0.5, []time.Duration{100 * ms, 300 * ms, 50 * ms}, []time.Duration{200 * ms, 600 * ms, 100 * ms}, 450 * ms},
		{"flat out", 1, []time.Duration{100 * ms}, []time.Duration{100 * ms, 100 * ms, 100 * ms}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := &pacedStore{n: 10, took: tt.took}
				start := time.Now()
				res, err := idem.Purge(t.Context(), st, idem.PurgeParams{Consumer: "c", RetentionWindow: time.Hour, BatchSize: 3, DutyCycle: tt.share})
				if err != nil {
					t.Fatal(err)
				}
				if res.Deleted != 10 || res.Batches != 4 || st.n != 0 {
					t.Errorf("deleted %d in %d batches, %d left; want 10 in 4, none left", res.Deleted, res.Batches, st.n)
				}
				if g := st.gaps(); !slices.Equal(g, tt.gaps) {
					t.Errorf("batch starts %v apart, want %v", g, tt.gaps)
				}
				if res.Paused != tt.paused {
					t.Errorf("Paused %v, want %v", res.Paused, tt.paused)
				}
				// The last batch ends the purge: no pause after it.
				last := tt.took[min(3, len(tt.took)-1)]
				if took, want := time.Since(start), sumDurations(tt.gaps)+last; took != want {
					t.Errorf("purge took %v, want %v", took, want)
				}
			})
		})
	}
}

// Cancelling ctx during a pause ends the purge at once with ctx's error;
// the batches already run stay deleted and are counted, and the pause is
// counted as far as it went.
func TestPurgeCancelDuringPause(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		st := &pacedStore{n: 10, took: []time.Duration{100 * time.Millisecond}}
		ctx, cancel := context.WithCancel(t.Context())
		start := time.Now()
		go func() {
			time.Sleep(time.Second) // inside the first pause of 9.9s
			cancel()
		}()
		res, err := idem.Purge(ctx, st, idem.PurgeParams{Consumer: "c", RetentionWindow: time.Hour, BatchSize: 3, DutyCycle: 0.01})
		if !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v, want context.Canceled", err)
		}
		if took := time.Since(start); took != time.Second {
			t.Errorf("Purge returned %v after it started, want 1s (when ctx was cancelled)", took)
		}
		if res.Deleted != 3 || res.Batches != 1 || st.n != 7 {
			t.Errorf("deleted %d in %d batches, %d left; want 3 in 1, 7 left", res.Deleted, res.Batches, st.n)
		}
		if res.Paused != 900*time.Millisecond {
			t.Errorf("Paused %v, want 900ms (the pause until the cancel)", res.Paused)
		}
	})
}

// A duty cycle outside (0, 1] is refused with ErrInvalidConfig by Purge,
// NewConsumer and NewLeaseConsumer, before the store is touched.
func TestPurgeDutyCycleInvalid(t *testing.T) {
	t.Parallel()
	for _, share := range []float64{-0.1, 1.01, math.NaN(), math.Inf(1)} {
		st := &pacedStore{n: 10, took: []time.Duration{0}}
		_, err := idem.Purge(t.Context(), st, idem.PurgeParams{Consumer: "c", RetentionWindow: time.Hour, BatchSize: 3, DutyCycle: share})
		if !errors.Is(err, idem.ErrInvalidConfig) || st.n != 10 {
			t.Errorf("Purge with DutyCycle %v: %v, %d records left; want ErrInvalidConfig, 10", share, err, st.n)
		}
		cfg := idem.Config{Name: "c", PurgeInterval: -1, PurgeDutyCycle: share}
		if _, err := idem.NewConsumer(idem.NewMemoryStore(nil), cfg); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("NewConsumer with PurgeDutyCycle %v: %v, want ErrInvalidConfig", share, err)
		}
		if _, err := idem.NewLeaseConsumer(idem.NewMemoryStore(nil), cfg); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("NewLeaseConsumer with PurgeDutyCycle %v: %v, want ErrInvalidConfig", share, err)
		}
	}
}

// slowBatchStore is a MemoryStore whose purge batches take a second each
// on the bubble's clock.
type slowBatchStore struct{ *idem.MemoryStore }

func (s slowBatchStore) BeginPurge(ctx context.Context, p *idemdriver.BeginPurgeParams) (idemdriver.PurgeSession, error) {
	ps, err := s.MemoryStore.BeginPurge(ctx, p)
	return slowBatchSession{ps}, err
}

type slowBatchSession struct{ idemdriver.PurgeSession }

func (s slowBatchSession) DeleteBatch(ctx context.Context, p *idemdriver.PurgeBatchParams) (int64, error) {
	time.Sleep(time.Second)
	return s.PurgeSession.DeleteBatch(ctx, p)
}

// purgeRecorder keeps the consumer's purge events.
type purgeRecorder struct {
	mu     sync.Mutex
	events []idem.PurgeEvent
}

func (r *purgeRecorder) OnPurge(_ context.Context, e idem.PurgeEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

// The background loop's purge deletes one record a second (batches of 1
// taking a second each, flat out). Records arriving one every two seconds
// are purged in about half the span they were written over, every purge
// after the first; arriving one every 0.7s, each purge takes about 1.4
// times its span (PurgeEvent.Span), the next one's span is longer by as
// much, and the loop warns that it is falling behind.
func TestPurgeLoopFallingBehind(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		every  time.Duration
		behind bool
	}{
		{"keeps up", 2 * time.Second, false},
		{"falls behind", 700 * time.Millisecond, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var logs bytes.Buffer
				rec := &purgeRecorder{}
				c, err := idem.NewConsumer(slowBatchStore{idem.NewMemoryStore(nil)}, idem.Config{
					Name:            "c",
					RetentionWindow: time.Minute,
					PurgeInterval:   time.Minute,
					PurgeBatchSize:  1,
					PurgeDutyCycle:  1,
					Logger:          slog.New(slog.NewTextHandler(&logs, nil)),
					Hooks:           []idem.Hook{rec},
				})
				if err != nil {
					t.Fatal(err)
				}
				h := func(context.Context, *idem.MemoryTx, idem.Message) error { return nil }
				ctx, stop := context.WithTimeout(t.Context(), 20*time.Minute)
				defer stop()
				for i := 0; ctx.Err() == nil; i++ {
					if _, err := c.Process(ctx, idem.Message{ID: time.Now().Format(time.RFC3339Nano)}, h); err != nil && ctx.Err() == nil {
						t.Fatal(err)
					}
					select {
					case <-ctx.Done():
					case <-time.After(tt.every):
					}
				}
				if err := c.Close(); err != nil {
					t.Fatal(err)
				}
				rec.mu.Lock()
				defer rec.mu.Unlock()
				spans, first := 0, true
				for i, e := range rec.events {
					if e.Err != nil || e.Result.Horizon.IsZero() {
						continue
					}
					if first {
						first = false
						if e.Span != 0 {
							t.Errorf("first purge with a horizon: Span %v, want 0", e.Span)
						}
						continue
					}
					if e.Result.Deleted == 0 {
						continue
					}
					// The purge's share of the work is the records written
					// over its span: the ratio of its latency to its span is
					// the inflow over the purge's rate.
					spans++
					if r := e.Latency.Seconds() / e.Span.Seconds(); (r >= 1) != tt.behind {
						t.Errorf("purge %d: latency %v over span %v = %.2f; behind = %v", i, e.Latency, e.Span, r, tt.behind)
					}
				}
				if spans < 2 {
					t.Errorf("%d purges after the first deleted anything, want at least 2", spans)
				}
				if got := strings.Contains(logs.String(), "purge is falling behind"); got != tt.behind {
					t.Errorf("falling-behind warning logged: %v, want %v; logs:\n%s", got, tt.behind, logs.String())
				}
			})
		})
	}
}

func sumDurations(ds []time.Duration) (s time.Duration) {
	for _, d := range ds {
		s += d
	}
	return s
}

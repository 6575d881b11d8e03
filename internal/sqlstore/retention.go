package sqlstore

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/idem-go/idem/idemdriver"
)

// RunQueries are a dialect's statements over the runs table (Table +
// "_runs": consumer, started_at, ended_at, times in the dialect's
// representation, converted to and from microseconds by the statements).
type RunQueries struct {
	// Newest: consumer -> the newest run's started_at and ended_at, and
	// the server's now (µs). Empty for a dialect whose Extend is the
	// whole of MarkRunning.
	Newest string
	// Extend: with Newest, consumer, started_at (µs), gap (µs): sets that
	// run's end to now if it ended no more than gap ago. Without Newest,
	// consumer, gap (µs): the whole of MarkRunning in one statement.
	Extend string
	// Insert: consumer: a new run [now, now], merged with a run that
	// starts at the same instant.
	Insert string
	// Runs: consumer -> started_at (µs), ended_at (µs), by start.
	Runs string
	// Count: consumer, horizon (µs) -> the completed and failed records
	// written before the horizon.
	Count string
	// Prune: consumer, t (µs): deletes the runs that ended before t.
	Prune string
}

// MarkRunning records that p.Consumer runs now, by the server's clock.
// With q.Extend alone it runs that one statement. Otherwise it reads the newest run (q.Newest), extends it to now with q.Extend if
// p.MaxGap is positive and the run ended no more than p.MaxGap ago, and
// otherwise (or when the extension changed no row) adds a new run [now,
// now] with q.Insert, which merges with a run that starts at the same
// instant. A run added needlessly is empty and changes no sum of running
// time. Parameters are checked first (ValidateMarkRunningParams).
func MarkRunning(ctx context.Context, db Querier, q *RunQueries, p *idemdriver.MarkRunningParams) error {
	if err := idemdriver.ValidateMarkRunningParams(p); err != nil {
		return err
	}
	if q.Newest == "" {
		_, err := db.Exec(ctx, q.Extend, p.Consumer, DurationMicros(p.MaxGap))
		return err
	}
	if p.MaxGap > 0 {
		var start, end, now int64
		err := db.QueryRow(ctx, q.Newest, p.Consumer).Scan(&start, &end, &now)
		switch {
		case err == nil && now-end <= DurationMicros(p.MaxGap):
			n, err := db.Exec(ctx, q.Extend, p.Consumer, start, DurationMicros(p.MaxGap))
			if err != nil || n > 0 {
				return err
			}
		case err != nil && !errors.Is(err, ErrNoRows):
			return err
		}
	}
	_, err := db.Exec(ctx, q.Insert, p.Consumer)
	return err
}

// Session is a purge session (idemdriver.PurgeSession) on db, under a
// purge lock that release gives back. Statements come from q; DeleteBatch
// is the dialect's.
type Session struct {
	db       Querier
	q        *RunQueries
	consumer string
	batch    func(ctx context.Context, consumer string, horizonUS int64, limit int) (int64, error)
	release  func(ctx context.Context) error
	once     sync.Once
	err      error
}

// NewSession returns the purge session of consumer on db. batch deletes
// one batch (consumer, horizon µs, limit); release releases the lock (and
// discards the connection if it cannot) and is called once, by Close.
func NewSession(db Querier, q *RunQueries, consumer string,
	batch func(ctx context.Context, consumer string, horizonUS int64, limit int) (int64, error),
	release func(ctx context.Context) error) *Session {
	return &Session{db: db, q: q, consumer: consumer, batch: batch, release: release}
}

var _ idemdriver.PurgeSession = (*Session)(nil)

// Runs implements idemdriver.PurgeSession: the consumer's runs, oldest
// first.
func (s *Session) Runs(ctx context.Context) ([]idemdriver.Run, error) {
	rows, err := s.db.Query(ctx, s.q.Runs, s.consumer)
	if err != nil {
		return nil, err
	}
	var out []idemdriver.Run
	err = ForEach(rows, func(r Row) error {
		var start, end int64
		if err := r.Scan(&start, &end); err != nil {
			return err
		}
		out = append(out, idemdriver.Run{Start: Time(start), End: Time(end)})
		return nil
	})
	return out, err
}

// CountBefore implements idemdriver.PurgeSession: the completed and
// failed records written before horizon (truncated to a microsecond).
func (s *Session) CountBefore(ctx context.Context, horizon time.Time) (int64, error) {
	if err := idemdriver.ValidateHorizon(horizon); err != nil {
		return 0, err
	}
	var n int64
	err := s.db.QueryRow(ctx, s.q.Count, s.consumer, Micros(horizon)).Scan(&n)
	return n, err
}

// DeleteBatch implements idemdriver.PurgeSession with the dialect's batch.
func (s *Session) DeleteBatch(ctx context.Context, p *idemdriver.PurgeBatchParams) (int64, error) {
	if err := idemdriver.ValidatePurgeBatchParams(p); err != nil {
		return 0, err
	}
	return s.batch(ctx, s.consumer, Micros(p.Horizon), p.Limit)
}

// PruneRuns implements idemdriver.PurgeSession: it deletes the runs that
// ended before t (truncated to a microsecond).
func (s *Session) PruneRuns(ctx context.Context, t time.Time) error {
	if err := idemdriver.ValidateHorizon(t); err != nil {
		return err
	}
	_, err := s.db.Exec(ctx, s.q.Prune, s.consumer, Micros(t))
	return err
}

// Close implements idemdriver.PurgeSession: it releases the lock once;
// later calls return the first call's result.
func (s *Session) Close(ctx context.Context) error {
	s.once.Do(func() { s.err = s.release(ctx) })
	return s.err
}

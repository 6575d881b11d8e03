package idemdriver

import (
	"context"
	"time"
)

// Retainer is what retention needs of a store: a record of when the
// consumer was running, and a purge session that deletes bounded batches
// under a one-cleaner lock. The policy (which records may go) is the
// core's, in idem.Purge; a store only keeps runs and deletes what it is
// told to.
//
// The rule the core applies: a processed record is deleted only after its
// consumer has been running for at least the retention window since the
// record was written. Time in which the consumer was not running does not
// count, whatever messages arrive after a restart and whichever process
// runs the purge, so a consumer that was down for longer than the window
// still recognises the redeliveries of its downtime. A running consumer
// calls MarkRunning periodically; the core sums the runs backwards from the
// newest to find the horizon.
type Retainer interface {
	// MarkRunning records, by the store's clock, that the consumer is
	// running now. If the consumer's newest run ended no more than
	// p.MaxGap ago, that run is extended to now; otherwise a new run
	// [now, now] is added. A MaxGap of zero always adds a new run, which
	// is what a consumer does on its first call after it starts, so its
	// downtime is never counted as running. Runs of one consumer may
	// overlap (several processes share a consumer name); the core merges
	// them. Invalid parameters are refused (ValidateMarkRunningParams).
	MarkRunning(ctx context.Context, p *MarkRunningParams) error

	// BeginPurge takes the consumer's purge lock, so that one cleaner runs
	// at a time per consumer (and table), and returns the session that
	// purges under it. It returns ErrPurgeInProgress at once when another
	// session holds the lock. The lock outlives no process: a session
	// whose process dies releases it (a database session lock, or a lease
	// of at most a minute that the session renews).
	BeginPurge(ctx context.Context, p *BeginPurgeParams) (PurgeSession, error)
}

// PurgeSession is one cleaner's hold on a consumer's purge lock. It is
// used by one goroutine; Close ends it and releases the lock.
type PurgeSession interface {
	// Runs returns the consumer's recorded runs, by start time, oldest
	// first.
	Runs(ctx context.Context) ([]Run, error)
	// CountBefore counts the consumer's completed and failed records
	// written before horizon. in_progress records are never counted.
	CountBefore(ctx context.Context, horizon time.Time) (int64, error)
	// DeleteBatch deletes at most p.Limit of the consumer's completed and
	// failed records written before p.Horizon, oldest first, with their
	// recovery points, in one short transaction of its own (so claims
	// keep flowing), and returns how many it deleted. in_progress records
	// are never deleted, however old: their lease is live, or they wait
	// for the next attempt. Rows locked by a claim in flight may be
	// skipped.
	DeleteBatch(ctx context.Context, p *PurgeBatchParams) (int64, error)
	// PruneRuns deletes the runs that ended before t: the core calls it
	// with the horizon, which only ever moves forward, so those runs are
	// never needed again.
	PruneRuns(ctx context.Context, t time.Time) error
	// Close releases the purge lock. It is safe to call more than once;
	// a session whose lock cannot be released ends its database session,
	// which releases it.
	Close(ctx context.Context) error
}

// Run is a time span in which a consumer was running, by the store's
// clock: from its first MarkRunning to its last.
type Run struct {
	Start, End time.Time
}

// MarkRunningParams names the consumer that is running.
type MarkRunningParams struct {
	// Consumer is the consumer name.
	Consumer string
	// MaxGap is how long after the newest run's end the consumer may mark
	// itself running and still extend that run. Zero starts a new run.
	MaxGap time.Duration
}

// BeginPurgeParams names the consumer to purge.
type BeginPurgeParams struct {
	// Consumer is the consumer name.
	Consumer string
}

// PurgeBatchParams bounds one DeleteBatch.
type PurgeBatchParams struct {
	// Horizon is the cut-off: records written before it may go.
	Horizon time.Time
	// Limit is the most records one batch deletes; positive.
	Limit int
}

package idempgxv5

import (
	"context"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/sqlstore"
)

// MarkRunning implements [idemdriver.Retainer] with one statement on the
// runs table (Table + "_runs"), by the server's clock (now()): the
// consumer's newest run is extended to now if p.MaxGap is positive and
// the run ended no more than p.MaxGap ago, otherwise a new run [now, now]
// is added. p is checked first (idemdriver.ValidateMarkRunningParams).
func (s *Store) MarkRunning(ctx context.Context, p *idemdriver.MarkRunningParams) error {
	return sqlstore.MarkRunning(ctx, querier{s.pool}, &s.q.Runs, p)
}

// BeginPurge implements [idemdriver.Retainer]: it acquires a connection of
// its own and takes the consumer's purge lock on it with
// pg_try_advisory_lock (a session lock; the key is FNV-1a 64 of "idem",
// "purge", the table as configured and the consumer, NUL-separated, the
// same as store/idemsql's, so the two stores and `idem purge` exclude each
// other), or returns an error matching idemdriver.ErrPurgeInProgress at
// once when another session holds it.
//
// The session's statements run on that connection: each DeleteBatch is
// one statement in a transaction of its own, which picks the batch oldest
// first with FOR UPDATE SKIP LOCKED (so claims and lease writes are never
// waited for), and deletes the records and their rows in Table + "_steps"
// in data-modifying CTEs; in_progress records are never deleted. Close
// releases the lock with pg_advisory_unlock and gives the connection back;
// if that fails the connection is closed, which ends the session and its
// lock. p is checked first (idemdriver.ValidateBeginPurgeParams).
func (s *Store) BeginPurge(ctx context.Context, p *idemdriver.BeginPurgeParams) (idemdriver.PurgeSession, error) {
	if err := idemdriver.ValidateBeginPurgeParams(p); err != nil {
		return nil, err
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return s.q.BeginPurge(ctx, querier{conn}, p.Consumer, func(ctx context.Context, discard bool) error {
		if discard && !conn.Conn().IsClosed() {
			return conn.Hijack().Close(ctx)
		}
		conn.Release() // a closed connection is destroyed by the pool
		return nil
	})
}

package idempgxv5

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/pgsql"
	"github.com/idem-go/idem/internal/sqlstore"
)

// MarkRunning implements [idemdriver.Retainer] with one statement on the
// runs table (Table + "_runs"), by the server's clock (now()): the
// consumer's newest run is extended to now if p.MaxGap is positive and
// the run ended no more than p.MaxGap ago, otherwise a new run [now, now]
// is added. p is checked first (idemdriver.ValidateMarkRunningParams).
// On the partitioned layout it then creates the partitions ahead
// (EnsurePartitions) when the last one made ahead ends within a bucket.
func (s *Store) MarkRunning(ctx context.Context, p *idemdriver.MarkRunningParams) error {
	if err := sqlstore.MarkRunning(ctx, querier{s.pool}, &s.tab.V1().Runs, p); err != nil {
		return err
	}
	return s.ensureSoon(ctx)
}

// BeginPurge implements [idemdriver.Retainer]: it begins a transaction
// of its own that takes the consumer's purge lock with
// pg_try_advisory_xact_lock and stays open, idle, until Close rolls it
// back, or returns an error matching idemdriver.ErrPurgeInProgress at
// once when another transaction or session holds it. The key is FNV-1a 64
// of "idem", "purge", the table as configured and the consumer,
// NUL-separated, the same as store/idemsql's, so the two stores and `idem
// purge` exclude each other. A transaction-scoped lock works behind
// PgBouncer in transaction pooling, where a session lock would stay on
// whichever server connection took it; the lock transaction writes
// nothing and keeps no snapshot, and the server releases its lock when a
// crashed purger's connection drops.
//
// The session's statements run on the pool, so a purge holds two
// connections at once: each DeleteBatch first checks that the lock
// transaction still holds the lock, then runs one statement in a
// transaction of its own, which picks the batch oldest first with FOR
// UPDATE SKIP LOCKED (so claims and lease writes are never waited for),
// and deletes the records and their rows in Table + "_steps" in
// data-modifying CTEs; in_progress records are never deleted. p is
// checked first (idemdriver.ValidateBeginPurgeParams).
//
// On the partitioned layout a batch first records the consumer's horizon
// in Table + "_horizons", then drops each partition whose upper bound is
// at or before the horizon of every consumer with records in it (the
// consumers found by a loose index scan of its primary key): ALTER TABLE
// ... DETACH PARTITION ... CONCURRENTLY (each attempt cancelled after
// 5s, 3 attempts), then DROP TABLE. The drops of one table run one
// purger at a time, whatever the consumer, under a second advisory lock
// held by a transaction of its own (a purger that finds it taken drops
// nothing that time), so a purge holds up to three connections of the
// pool at once. The consumer's records in the dropped
// partitions are reported as deleted, at most the batch's Limit per
// batch, over as many batches as they need (the records of other
// consumers dropped with them are not reported). Then, with
// Partitions.ExactPurge, batches delete the remaining records before the
// horizon row by row, as on the default layout; without it the purge
// ends there, and records before the horizon stay until their partition
// can be dropped. CountBefore (a dry run) counts every record before the
// horizon.
func (s *Store) BeginPurge(ctx context.Context, p *idemdriver.BeginPurgeParams) (idemdriver.PurgeSession, error) {
	if err := idemdriver.ValidateBeginPurgeParams(p); err != nil {
		return nil, err
	}
	var del pgsql.DeleteFunc
	q := s.tab.V1() // the partitioned layout's shape
	if s.part != nil {
		d := &dropper{s: s, rows: q.DeleteRows(querier{s.pool})}
		del = d.batch
	} else {
		// The shape found now serves the whole purge; a batch that fails
		// because it changed makes the Store find it again.
		var err error
		if q, err = s.tab.Shape(ctx, querier{s.pool}); err != nil {
			return nil, err
		}
		rows := q.DeleteRows(querier{s.pool})
		del = func(ctx context.Context, consumer string, horizonUS int64, limit int) (int64, error) {
			n, err := rows(ctx, consumer, horizonUS, limit)
			if pgsql.ShapeChanged(err) {
				s.tab.Reset()
			}
			return n, err
		}
	}
	return q.BeginPurgeWith(ctx, querier{s.pool}, p.Consumer, func(ctx context.Context) (pgsql.LockTx, error) {
		tx, err := s.pool.Begin(ctx)
		if err != nil {
			return nil, err
		}
		return lockTx{querier{tx}, tx}, nil
	}, del)
}

// lockTx is a pgx transaction as a pgsql.LockTx.
type lockTx struct {
	querier
	tx pgx.Tx
}

// Rollback ends the transaction; pgxpool closes a broken connection.
func (l lockTx) Rollback(ctx context.Context) error { return l.tx.Rollback(ctx) }

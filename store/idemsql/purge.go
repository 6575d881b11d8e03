package idemsql

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// sqlitePurging holds the in-process purge locks of SQLite stores, keyed
// by database file, table and consumer.
var sqlitePurging sync.Map

// Purge implements [idemdriver.TxStore] and [idemdriver.LeaseStore]: it deletes
// p.Consumer's completed and failed records written before the horizon,
// the consumer's newest processed_at minus p.RetentionWindow (rounded up
// to a microsecond), both computed by the server, together with their
// recovery points. in_progress lease records are never deleted, however
// old (their lease live, expired or released): a later attempt may still
// take them over. The horizon follows the consumer's last activity (any
// record, in progress ones included), not the clock, so a consumer that was
// down longer than the window keeps its history. A consumer with no records
// has nothing to purge (zero Horizon).
//
// One cleaner runs at a time per (table, consumer); when another holds the
// lock, Purge returns [idem.ErrPurgeInProgress] at once:
//
//   - PostgreSQL: pg_try_advisory_lock on a dedicated connection (the key
//     derives from the table and consumer names, as in store/idempgxv5),
//     released with pg_advisory_unlock.
//   - MySQL: GET_LOCK(name, 0) on a dedicated connection (the name derives
//     from the database, table and consumer), released with RELEASE_LOCK.
//   - SQLite: an in-process lock keyed by database file, table and
//     consumer. Across processes nothing excludes a second cleaner, and
//     nothing needs to: SQLite runs one writer at a time, so two cleaners
//     only take turns deleting.
//
// If the lock cannot be released the connection is closed, which releases
// it. Rows are deleted oldest first, at most p.BatchSize per batch, each
// batch its own short transaction, so claims keep flowing: on PostgreSQL
// one statement that picks the batch skipping rows locked by others (FOR
// UPDATE SKIP LOCKED) and deletes the records and their steps; on MySQL a
// locking SELECT ... ORDER BY processed_at LIMIT, then DELETEs of those
// records and their steps by primary key; on SQLite (BEGIN IMMEDIATE) a
// DELETE of a LIMITed rowid subquery RETURNING the IDs, then a DELETE of
// their steps. p.OnBatch is called after each batch. With p.DryRun one
// SELECT counts the rows a purge would delete now (reported as one batch
// when there are any) and nothing is deleted. Cancelling ctx stops between
// or during batches; the batches already run stay deleted and are counted
// in the result.
func (s *Store) Purge(ctx context.Context, p *idem.PurgeParams) (idem.PurgeResult, error) {
	var res idem.PurgeResult
	if err := idemdriver.ValidatePurgeParams(p); err != nil {
		return res, err
	}
	ex, release, err := s.purgeLock(ctx, p.Consumer)
	if err != nil {
		return res, err
	}
	defer release()

	window := int64((p.RetentionWindow + time.Microsecond - 1) / time.Microsecond)
	var horizon sql.NullInt64
	if err := ex.QueryRowContext(ctx, s.q.horizon, window, p.Consumer).Scan(&horizon); err != nil {
		return res, fmt.Errorf("idemsql: purge horizon: %w", err)
	}
	if !horizon.Valid {
		return res, nil
	}
	res.Horizon = time.UnixMicro(horizon.Int64).UTC()

	if p.DryRun {
		if err := ex.QueryRowContext(ctx, s.q.purgeCount, p.Consumer, horizon.Int64).Scan(&res.Deleted); err != nil {
			return res, fmt.Errorf("idemsql: purge count: %w", err)
		}
		if res.Deleted > 0 {
			res.Batches = 1
			if p.OnBatch != nil {
				p.OnBatch(res.Deleted)
			}
		}
		return res, nil
	}
	for {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		n, err := s.purgeBatch(ctx, ex, p.Consumer, horizon.Int64, p.BatchSize)
		if err != nil {
			return res, fmt.Errorf("idemsql: purge batch: %w", err)
		}
		if n == 0 {
			return res, nil
		}
		res.Deleted += n
		res.Batches++
		if p.OnBatch != nil {
			p.OnBatch(res.Deleted)
		}
		if n < int64(p.BatchSize) {
			return res, nil
		}
	}
}

// purgeConn is what a purge runs on: the connection holding the purge
// lock, or the pool for SQLite.
type purgeConn interface {
	execer
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// purgeLock takes the purge lock of (table, consumer). It returns what the
// purge statements run on (the lock's connection, or the pool for SQLite)
// and the function that releases the lock. It returns
// idem.ErrPurgeInProgress when another cleaner holds the lock.
func (s *Store) purgeLock(ctx context.Context, consumer string) (purgeConn, func(), error) {
	switch s.dialect {
	case Postgres:
		conn, err := s.db.Conn(ctx)
		if err != nil {
			return nil, nil, err
		}
		key := lockKey("purge", s.table.Qualified, consumer)
		var locked bool
		if err := conn.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&locked); err != nil {
			conn.Close()
			return nil, nil, fmt.Errorf("idemsql: purge lock: %w", err)
		}
		if !locked {
			conn.Close()
			return nil, nil, idem.ErrPurgeInProgress
		}
		return conn, func() {
			rctx, cancel := detached(ctx)
			defer cancel()
			var unlocked bool
			if err := conn.QueryRowContext(rctx, `SELECT pg_advisory_unlock($1)`, key).Scan(&unlocked); err != nil || !unlocked {
				discard(conn)
			}
			conn.Close()
		}, nil
	case MySQL:
		conn, err := s.db.Conn(ctx)
		if err != nil {
			return nil, nil, err
		}
		name := mysqlLockName("purge", 2)
		var got sql.NullInt64
		if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(`+name+`, 0)`, s.table.Qualified, consumer).Scan(&got); err != nil {
			conn.Close()
			return nil, nil, fmt.Errorf("idemsql: purge lock: %w", err)
		}
		if !got.Valid {
			conn.Close()
			return nil, nil, fmt.Errorf("idemsql: purge lock: GET_LOCK failed")
		}
		if got.Int64 != 1 {
			conn.Close()
			return nil, nil, idem.ErrPurgeInProgress
		}
		return conn, func() {
			releaseMySQLLock(ctx, conn, name, s.table.Qualified, consumer)
			conn.Close()
		}, nil
	default:
		key := s.lockScope + "\x00" + s.table.Qualified + "\x00" + consumer
		if _, held := sqlitePurging.LoadOrStore(key, struct{}{}); held {
			return nil, nil, idem.ErrPurgeInProgress
		}
		return s.db, func() { sqlitePurging.Delete(key) }, nil
	}
}

package idempgxv5

import (
	"context"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Purge implements [idemdriver.TxStore] and [idemdriver.LeaseStore]: it deletes
// p.Consumer's completed and failed records written before the horizon,
// the consumer's newest processed_at minus p.RetentionWindow (rounded up
// to a microsecond), computed by the server, with their recovery points.
// It never deletes an in_progress lease record, however old: its lease is
// live, or it waits for the next attempt. A consumer with no records has
// nothing to purge (zero Horizon).
//
// One cleaner runs at a time per (table, consumer): Purge holds a session
// advisory lock (pg_try_advisory_lock, key derived from the table and
// consumer names) on one connection for its whole run, and returns
// [idem.ErrPurgeInProgress] at once when another session holds it. The
// lock is released at the end; if that fails the connection is closed,
// which releases it too.
//
// Rows are deleted oldest first, at most p.BatchSize per batch, each batch
// one statement in its own short transaction (a SELECT ... FOR UPDATE SKIP
// LOCKED of the batch, the DELETE of the records and the DELETE of their
// rows in Table + "_steps", as data-modifying CTEs), so claims keep
// flowing while it runs and a record never loses its steps while it is
// kept. p.OnBatch is called after each batch. With p.DryRun one SELECT
// counts the records a purge would delete now (reported as one batch when
// there are any) and nothing is deleted. Cancelling ctx stops between or during batches; the batches
// already run stay deleted and are counted in the result.
func (s *Store) Purge(ctx context.Context, p *idem.PurgeParams) (idem.PurgeResult, error) {
	var res idem.PurgeResult
	if err := idemdriver.ValidatePurgeParams(p); err != nil {
		return res, err
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return res, err
	}
	key := lockKey("purge", s.table.Qualified, p.Consumer)
	var locked bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&locked); err != nil {
		conn.Release()
		return res, fmt.Errorf("idempgxv5: purge lock: %w", err)
	}
	if !locked {
		conn.Release()
		return res, idem.ErrPurgeInProgress
	}
	defer unlock(ctx, conn, key)

	window := (p.RetentionWindow + time.Microsecond - 1) / time.Microsecond
	var horizon pgtype.Timestamptz
	if err := conn.QueryRow(ctx, s.q.horizon, p.Consumer, int64(window)).Scan(&horizon); err != nil {
		return res, fmt.Errorf("idempgxv5: purge horizon: %w", err)
	}
	if !horizon.Valid {
		return res, nil
	}
	res.Horizon = horizon.Time

	if p.DryRun {
		if err := conn.QueryRow(ctx, s.q.purgeCount, p.Consumer, res.Horizon).Scan(&res.Deleted); err != nil {
			return res, fmt.Errorf("idempgxv5: purge count: %w", err)
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
		var n int64
		if err := conn.QueryRow(ctx, s.q.purgeBatch, p.Consumer, res.Horizon, int64(p.BatchSize)).Scan(&n); err != nil {
			return res, fmt.Errorf("idempgxv5: purge batch: %w", err)
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

// unlock releases the purge lock and the connection. A connection whose
// lock could not be released is closed rather than pooled, since the
// session lock would otherwise outlive the purge.
func unlock(ctx context.Context, conn *pgxpool.Conn, key int64) {
	if conn.Conn().IsClosed() {
		conn.Release() // the server ended the session and its locks
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	var ok bool
	err := conn.QueryRow(ctx, `SELECT pg_advisory_unlock($1)`, key).Scan(&ok)
	if err != nil || !ok {
		_ = conn.Hijack().Close(ctx)
		return
	}
	conn.Release()
}

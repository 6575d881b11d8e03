package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/pgsql"
	"github.com/idem-go/idem/internal/sqlstore"
)

// sqlitePurging holds the in-process purge locks of SQLite stores, keyed
// by database file, table and consumer.
var sqlitePurging sync.Map

// MarkRunning implements [idemdriver.Retainer] on the runs table (Table +
// "_runs"), by the server's clock: the consumer's newest run is extended
// to now if p.MaxGap is positive and the run ended no more than p.MaxGap
// ago, otherwise a new run [now, now] is added. On PostgreSQL it is one
// statement (store/idempgxv5's); on MySQL and SQLite a plain read of the
// newest run, an UPDATE of it by primary key and, unless that extended
// it, an INSERT (a needless one adds an empty run, which counts no running
// time). p is checked first (idemdriver.ValidateMarkRunningParams).
func (s *Store) MarkRunning(ctx context.Context, p *idemdriver.MarkRunningParams) error {
	q := &s.q.runs
	if s.dialect == Postgres {
		q = &s.pg.V1().Runs // the runs table is the same in both shapes
	}
	return sqlstore.MarkRunning(ctx, querier{s.db}, q, p)
}

// BeginPurge implements [idemdriver.Retainer]: it takes the purge lock of
// (table, consumer), or returns an error matching
// idemdriver.ErrPurgeInProgress at once when another session holds it:
//
//   - PostgreSQL: pg_try_advisory_xact_lock in a transaction of its own,
//     held open (idle, writing nothing, keeping no snapshot) until Close
//     rolls it back, with store/idempgxv5's key (FNV-1a 64 of "idem",
//     "purge", the table as configured and the consumer, NUL-separated),
//     so the two stores and `idem purge` exclude each other. Being
//     transaction-scoped it works behind PgBouncer in transaction pooling;
//     the purge's statements run on other connections of the pool (two
//     at once: keep SetMaxOpenConns at 2 or more), and each batch first
//     checks that the lock transaction still holds the lock.
//   - MySQL: GET_LOCK(name, 0) on a dedicated connection (the name derives
//     from the database, table and consumer), released with RELEASE_LOCK.
//   - SQLite: an in-process lock keyed by database file, table and
//     consumer. Across processes nothing excludes a second cleaner, and
//     nothing needs to: SQLite runs one writer at a time, so two cleaners
//     only take turns deleting.
//
// If the MySQL lock cannot be released the connection is closed, which releases
// it. Each DeleteBatch is its own short transaction, so claims keep
// flowing: on PostgreSQL one statement that picks the batch oldest first,
// skipping rows locked by others (FOR UPDATE SKIP LOCKED), and deletes the
// records and their steps; on MySQL a locking SELECT ... ORDER BY
// processed_at LIMIT, then DELETEs of those records and their steps by
// primary key; on SQLite (BEGIN IMMEDIATE) a DELETE of a LIMITed rowid
// subquery RETURNING the IDs, then a DELETE of their steps. in_progress
// records are never deleted. p is checked first
// (idemdriver.ValidateBeginPurgeParams).
func (s *Store) BeginPurge(ctx context.Context, p *idemdriver.BeginPurgeParams) (idemdriver.PurgeSession, error) {
	if err := idemdriver.ValidateBeginPurgeParams(p); err != nil {
		return nil, err
	}
	switch s.dialect {
	case Postgres:
		q, err := s.pg.Shape(ctx, querier{s.db})
		if err != nil {
			return nil, err
		}
		return q.BeginPurge(ctx, querier{s.db}, p.Consumer, func(ctx context.Context) (pgsql.LockTx, error) {
			// Not ended with ctx (a call's context): the transaction
			// holds the lock until the session's Close.
			tx, err := s.db.BeginTx(context.WithoutCancel(ctx), nil)
			if err != nil {
				return nil, err
			}
			return sqlLockTx{querier{tx}, tx}, nil
		})
	case MySQL:
		return s.beginPurgeMySQL(ctx, p.Consumer)
	}
	key := s.lockScope + "\x00" + s.table.Qualified + "\x00" + p.Consumer
	if _, held := sqlitePurging.LoadOrStore(key, struct{}{}); held {
		return nil, idemdriver.ErrPurgeInProgress
	}
	batch := func(ctx context.Context, consumer string, horizon int64, limit int) (int64, error) {
		return s.purgeBatchSQLite(ctx, s.db, consumer, horizon, limit)
	}
	return sqlstore.NewSession(querier{s.db}, &s.q.runs, p.Consumer, batch, func(context.Context) error {
		sqlitePurging.Delete(key)
		return nil
	}), nil
}

// beginPurgeMySQL takes the GET_LOCK purge lock on a connection of its own
// and returns the session on it.
func (s *Store) beginPurgeMySQL(ctx context.Context, consumer string) (idemdriver.PurgeSession, error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	name := mysqlLockName("purge", 2)
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(`+name+`, 0)`, s.table.Qualified, consumer).Scan(&got); err != nil {
		discard(conn)
		conn.Close()
		return nil, fmt.Errorf("idemsql: purge lock: %w", err)
	}
	switch {
	case !got.Valid:
		conn.Close()
		return nil, errors.New("idemsql: purge lock: GET_LOCK failed")
	case got.Int64 != 1:
		conn.Close()
		return nil, idemdriver.ErrPurgeInProgress
	}
	batch := func(ctx context.Context, consumer string, horizon int64, limit int) (int64, error) {
		return s.purgeBatchMySQL(ctx, conn, consumer, horizon, limit)
	}
	return sqlstore.NewSession(querier{conn}, &s.q.runs, consumer, batch, func(ctx context.Context) error {
		err := releaseMySQLLock(ctx, conn, name, s.table.Qualified, consumer)
		return errors.Join(err, conn.Close())
	}), nil
}

// purgeConn is what a purge batch runs on: the connection holding the
// purge lock, or the pool for SQLite.
type purgeConn interface {
	sqlQuerier
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// sqlLockTx is a database/sql transaction as a pgsql.LockTx.
type sqlLockTx struct {
	querier
	tx *sql.Tx
}

// Rollback ends the transaction; database/sql discards a broken
// connection.
func (l sqlLockTx) Rollback(context.Context) error { return l.tx.Rollback() }

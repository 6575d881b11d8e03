package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"

	"github.com/idem-go/idem/internal/sqlschema"
)

// Migrate implements [idemdriver.Migrator]: it applies the dialect's migrations
// embedded in idem (internal/sqlschema) that the table has not had yet,
// and records each version, with the server's time, in Table +
// "_migrations" (version, applied_at). It is idempotent and safe to run
// from several processes at once; each takes a lock first and the later
// ones find nothing left to do:
//
//   - PostgreSQL: one transaction holding pg_advisory_xact_lock (the key
//     derives from the table name, as in store/idempgxv5, so the two stores
//     exclude each other). DDL is transactional: a failed migration leaves
//     nothing behind.
//   - MySQL: GET_LOCK on one connection (the lock name derives from the
//     database and table names), released with RELEASE_LOCK. MySQL commits
//     DDL implicitly, so each statement stands alone; the migrations are
//     written to be re-run safely after a failure halfway (IF NOT EXISTS,
//     and 002's ALTER TABLE runs only if information_schema shows the
//     table without its columns).
//   - SQLite: one BEGIN IMMEDIATE transaction on one connection, which
//     holds the write lock; DDL is transactional.
//
// Migrate needs the privilege to create tables and indexes. Errors are the
// driver's, wrapped with the step that failed.
func (s *Store) Migrate(ctx context.Context) error {
	migs, err := sqlschema.Migrations(sqlschema.Dialect(s.dialect), s.table)
	if err != nil {
		return fmt.Errorf("idemsql: migrations: %w", err)
	}
	switch s.dialect {
	case Postgres:
		return s.migratePostgres(ctx, migs)
	case MySQL:
		return s.migrateMySQL(ctx, migs)
	default:
		return s.migrateSQLite(ctx, migs)
	}
}

// execer is what the migration steps need of a *sql.Tx or *sql.Conn.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// applyMigrations creates the migrations table with createTable, then runs
// every migration of migs not recorded in it, recording each with record
// (which takes the version).
func (s *Store) applyMigrations(ctx context.Context, ex execer, migs []sqlschema.Migration, createTable, record string) error {
	if _, err := ex.ExecContext(ctx, createTable); err != nil {
		return fmt.Errorf("idemsql: create %s: %w", s.q.migTable, err)
	}
	rows, err := ex.QueryContext(ctx, `SELECT version FROM `+s.q.migTable)
	if err != nil {
		return fmt.Errorf("idemsql: read %s: %w", s.q.migTable, err)
	}
	done := map[int]bool{}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			rows.Close()
			return fmt.Errorf("idemsql: read %s: %w", s.q.migTable, err)
		}
		done[v] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("idemsql: read %s: %w", s.q.migTable, err)
	}
	for _, m := range migs {
		if done[m.Version] {
			continue
		}
		for _, st := range m.Statements() {
			if _, err := ex.ExecContext(ctx, st); err != nil {
				return fmt.Errorf("idemsql: migration %s: %w", m.Name, err)
			}
		}
		if _, err := ex.ExecContext(ctx, record, m.Version); err != nil {
			return fmt.Errorf("idemsql: record migration %s: %w", m.Name, err)
		}
	}
	return nil
}

func (s *Store) migratePostgres(ctx context.Context, migs []sqlschema.Migration) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("idemsql: migrate: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, lockKey("migrate", s.table.Qualified)); err != nil {
		return fmt.Errorf("idemsql: migrate lock: %w", err)
	}
	err = s.applyMigrations(ctx, tx, migs,
		`CREATE TABLE IF NOT EXISTS `+s.q.migTable+` (
	version    int PRIMARY KEY,
	applied_at timestamptz NOT NULL DEFAULT now()
)`,
		`INSERT INTO `+s.q.migTable+` (version, applied_at) VALUES ($1, now())`)
	if err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("idemsql: migrate commit: %w", err)
	}
	return nil
}

// mysqlLockName is a GET_LOCK name, unique per server: lock names are
// server-wide, so it covers the current database as well as the table
// (and the consumer for purges), hashed to stay within 64 characters.
func mysqlLockName(purpose string, params int) string {
	parts := "IFNULL(DATABASE(), '')"
	for range params {
		parts += ", ?"
	}
	return `CONCAT('idem:` + purpose + `:', SHA1(CONCAT_WS(0x00, ` + parts + `)))`
}

func (s *Store) migrateMySQL(ctx context.Context, migs []sqlschema.Migration) error {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("idemsql: migrate: %w", err)
	}
	defer conn.Close()
	name := mysqlLockName("migrate", 1)
	for {
		// Wait in short steps, so ctx is checked between them.
		var got sql.NullInt64
		if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(`+name+`, 2)`, s.table.Qualified).Scan(&got); err != nil {
			return fmt.Errorf("idemsql: migrate lock: %w", err)
		}
		if got.Valid && got.Int64 == 1 {
			break
		}
		if !got.Valid {
			return errors.New("idemsql: migrate lock: GET_LOCK failed")
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("idemsql: migrate lock: %w", err)
		}
	}
	defer releaseMySQLLock(ctx, conn, name, s.table.Qualified)
	return s.applyMigrations(ctx, conn, migs,
		`CREATE TABLE IF NOT EXISTS `+s.q.migTable+` (
    version    INT NOT NULL PRIMARY KEY,
    applied_at DATETIME(6) NOT NULL
) ENGINE=InnoDB`,
		`INSERT INTO `+s.q.migTable+` (version, applied_at) VALUES (?, UTC_TIMESTAMP(6))`)
}

// releaseMySQLLock releases a GET_LOCK lock held by conn. A connection
// whose lock could not be released is closed rather than pooled, which
// releases the lock (it belongs to the session).
func releaseMySQLLock(ctx context.Context, conn *sql.Conn, name string, args ...any) {
	rctx, cancel := detached(ctx)
	defer cancel()
	var released sql.NullInt64
	err := conn.QueryRowContext(rctx, `SELECT RELEASE_LOCK(`+name+`)`, args...).Scan(&released)
	if err != nil || !released.Valid || released.Int64 != 1 {
		discard(conn)
	}
}

func (s *Store) migrateSQLite(ctx context.Context, migs []sqlschema.Migration) (err error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("idemsql: migrate: %w", err)
	}
	defer conn.Close()
	// Explicit, whatever the DSN's _txlock: the write lock is taken
	// before the migrations table is read.
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return fmt.Errorf("idemsql: migrate: %w", err)
	}
	committed := false
	defer func() {
		if committed {
			return
		}
		rctx, cancel := detached(ctx)
		defer cancel()
		if _, rerr := conn.ExecContext(rctx, "ROLLBACK"); rerr != nil {
			discard(conn)
		}
	}()
	err = s.applyMigrations(ctx, conn, migs,
		`CREATE TABLE IF NOT EXISTS `+s.q.migTable+` (
    version    INTEGER PRIMARY KEY,
    applied_at INTEGER NOT NULL
)`,
		`INSERT INTO `+s.q.migTable+` (version, applied_at) VALUES (?1, `+sqliteNow+`)`)
	if err != nil {
		return err
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		return fmt.Errorf("idemsql: migrate commit: %w", err)
	}
	committed = true
	return nil
}

// lockKey derives a 64-bit PostgreSQL advisory lock key from a purpose and
// names: FNV-1a over "idem" and the NUL-separated parts, the same keys as
// store/idempgxv5, stable across processes and versions of idem.
func lockKey(parts ...string) int64 {
	h := fnv.New64a()
	h.Write([]byte("idem"))
	for _, p := range parts {
		h.Write([]byte{0})
		h.Write([]byte(p))
	}
	return int64(h.Sum64())
}

// detached returns a context for cleanup after ctx may have ended.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
}

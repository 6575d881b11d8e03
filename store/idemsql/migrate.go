package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/sqlschema"
	"github.com/idem-go/idem/internal/sqlstore"
)

// Migrate implements [idemdriver.Migrator]: it applies the dialect's migrations
// embedded in idem (internal/sqlschema) that the table has not had yet,
// and records each version, with the server's time, in Table +
// "_migrations" (version, applied_at). It is idempotent and safe to run
// from several processes at once; each takes a lock first and the later
// ones find nothing left to do:
//
//   - PostgreSQL: store/idempgxv5's: a transaction holding
//     pg_try_advisory_xact_lock (the key derives from the table name, the
//     same in both stores, so they exclude each other), the migrations in
//     it; an index built concurrently (011 on an outbox of 10,000 rows or
//     more) is built outside any transaction while another one holds the
//     lock, so that one needs two open connections or more. DDL is transactional: a failed migration
//     leaves nothing behind.
//   - MySQL: GET_LOCK on one connection (the lock name derives from the
//     database and table names), released with RELEASE_LOCK. MySQL commits
//     DDL implicitly, so each statement stands alone; the migrations are
//     written to be re-run safely after a failure halfway (IF NOT EXISTS,
//     002's ALTER TABLE runs only if information_schema shows the table
//     without its columns, 006's only while it shows one of the columns
//     it makes nullable NOT NULL). The session's lock_wait_timeout is 1
//     second meanwhile (put back after): a statement that waits longer
//     for a table's metadata lock (006's ALTER TABLE behind a transaction
//     that used the table) gives way, so that the statements queued behind
//     it go on, and runs again after a pause, until ctx ends (the error
//     then matches idemdriver.ErrLockTimeout and ctx's).
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
	return s.migrate(ctx, migs)
}

// migrate applies migs as Migrate applies the embedded migrations.
func (s *Store) migrate(ctx context.Context, migs []sqlschema.Migration) error {
	switch s.dialect {
	case Postgres:
		return s.migratePostgres(ctx, migs)
	case MySQL:
		return s.migrateMySQL(ctx, migs)
	default:
		return s.migrateSQLite(ctx, migs)
	}
}

func (s *Store) migratePostgres(ctx context.Context, migs []sqlschema.Migration) error {
	begin := func(ctx context.Context) (sqlstore.Tx, error) {
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		return sqlTx{querier{tx}, tx}, nil
	}
	err := s.pg.V1().Migrate(ctx, begin, twoConns{querier{s.db}, s.db}, migs)
	s.pg.Reset() // the migrations may have changed the table's shape
	if err != nil {
		return fmt.Errorf("idemsql: %w", err)
	}
	return nil
}

// twoConns runs the statements of a migration outside any transaction
// (internal/pgsql's Migrate) while another connection of db holds the
// migration lock: with at most one open connection it would wait for
// itself, so it refuses.
type twoConns struct {
	querier
	db *sql.DB
}

func (c twoConns) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	if c.db.Stats().MaxOpenConnections == 1 {
		return 0, fmt.Errorf("%w: a migration that builds an index concurrently needs two connections (SetMaxOpenConns(1))", idemdriver.ErrInvalidConfig)
	}
	return c.querier.Exec(ctx, query, args...)
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
	defer func() { _ = releaseMySQLLock(ctx, conn, name, s.table.Qualified) }()
	restore, err := boundMySQLLockWait(ctx, conn)
	if err != nil {
		return fmt.Errorf("idemsql: migrate: %w", err)
	}
	defer restore()
	if err := sqlstore.Apply(ctx, mysqlMigrator{querier{conn}}, migs, s.q.migrations); err != nil {
		return fmt.Errorf("idemsql: %w", err)
	}
	return nil
}

// mysqlMigrateLockWait is the session's lock_wait_timeout, in seconds,
// while Migrate runs MySQL migrations: the longest a statement of theirs
// waits for a table's metadata lock (an ALTER TABLE behind a transaction
// that has used the table, however long that transaction runs), and so
// the longest the statements on that table queued behind it wait, before
// it gives way (error 1205) and runs again after a pause.
const mysqlMigrateLockWait = 1

// boundMySQLLockWait sets conn's session lock_wait_timeout to
// mysqlMigrateLockWait (MySQL 8 has no SET STATEMENT for DDL) and returns
// the function that puts the session's value back; a connection whose
// value could not be put back is closed rather than pooled.
func boundMySQLLockWait(ctx context.Context, conn *sql.Conn) (restore func(), err error) {
	var saved int64
	if err := conn.QueryRowContext(ctx, `SELECT @@SESSION.lock_wait_timeout`).Scan(&saved); err != nil {
		return nil, err
	}
	if _, err := conn.ExecContext(ctx, `SET SESSION lock_wait_timeout = `+strconv.Itoa(mysqlMigrateLockWait)); err != nil {
		return nil, err
	}
	return func() {
		rctx, cancel := sqlstore.Detached(ctx)
		defer cancel()
		if _, err := conn.ExecContext(rctx, `SET SESSION lock_wait_timeout = `+strconv.FormatInt(saved, 10)); err != nil {
			discard(conn)
		}
	}, nil
}

// mysqlMigrator runs the statements of MySQL migrations, each committed
// on its own (DDL commits implicitly), running one again after a pause
// while it fails with error 1205 (sqlstore.RetryLockTimeout): a wait for
// a metadata lock past mysqlMigrateLockWait. Such a statement changed
// nothing, and the migrations are written to be re-run.
type mysqlMigrator struct{ querier }

func (m mysqlMigrator) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	return sqlstore.RetryLockTimeout(ctx, func() (int64, error) {
		n, err := m.querier.Exec(ctx, query, args...)
		return n, mysqlWrapLockTimeout(err)
	})
}

// releaseMySQLLock releases a GET_LOCK lock held by conn. A connection
// whose lock could not be released is closed rather than pooled, which
// releases the lock (it belongs to the session); the error says so.
func releaseMySQLLock(ctx context.Context, conn *sql.Conn, name string, args ...any) error {
	rctx, cancel := sqlstore.Detached(ctx)
	defer cancel()
	var released sql.NullInt64
	err := conn.QueryRowContext(rctx, `SELECT RELEASE_LOCK(`+name+`)`, args...).Scan(&released)
	if err == nil && (!released.Valid || released.Int64 != 1) {
		err = errors.New("the session did not hold the lock")
	}
	if err != nil {
		discard(conn)
		return fmt.Errorf("idemsql: release lock: %w", err)
	}
	return nil
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
		rctx, cancel := sqlstore.Detached(ctx)
		defer cancel()
		if _, rerr := conn.ExecContext(rctx, "ROLLBACK"); rerr != nil {
			discard(conn)
		}
	}()
	if err := sqlstore.Apply(ctx, querier{conn}, migs, s.q.migrations); err != nil {
		return fmt.Errorf("idemsql: %w", err)
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		return fmt.Errorf("idemsql: migrate commit: %w", err)
	}
	committed = true
	return nil
}

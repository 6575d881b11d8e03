package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

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
//     it makes nullable NOT NULL).
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
	if err := sqlstore.Apply(ctx, querier{conn}, migs, s.q.migrations); err != nil {
		return fmt.Errorf("idemsql: %w", err)
	}
	return nil
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

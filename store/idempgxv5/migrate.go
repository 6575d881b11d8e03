package idempgxv5

import (
	"context"
	"fmt"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/sqlschema"
	"github.com/idem-go/idem/internal/sqlstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Migrate implements [idemdriver.Migrator]: it applies the PostgreSQL
// migrations embedded in idem (internal/sqlschema: 001 the
// processed-messages table, 002 the lease-mode columns and Table +
// "_steps", 003 the runs table Table + "_runs", 004 and 005 the outbox,
// 006 the lease-mode columns nullable for transactional records, 007 the
// outbox's index for the relay's order check, 008 the outbox's fill
// factor of 50, 009 the processed table's CHECK constraints dropped: the
// stores check every value before writing it, and PostgreSQL plans a
// table's CHECK expressions anew for every statement that writes it, half
// the server time of a claim; 010 the outbox's byte-length checks moved
// to the domains Table + "_outbox_id" and Table + "_outbox_str", whose
// checks are compiled once per connection, for the programs in other
// languages that write its rows; 011 the order check's index on a hash of
// the ordering key, built concurrently on an outbox of 10,000 rows or
// more) that the table has not had yet, and records each version with the
// server's time in Table + "_migrations" (version int primary key,
// applied_at timestamptz).
//
// A transaction holding a transaction-level advisory lock
// (pg_try_advisory_xact_lock, tried again until held; the key derives
// from the table name, the same key as store/idemsql's) serialises
// processes migrating the same table; the later ones find nothing left to
// do, and runs the migrations, except one that builds an index
// concurrently (011 on an outbox of 10,000 rows or more): its statements
// run each on its own while another transaction holding the lock idles
// (one that needs the table's exclusive lock waits for it at most a
// second, then gives way and runs again, so consumers running meanwhile
// never queue behind it for longer),
// so that one needs a pool of two connections or more (a pool of one
// gets an error matching idemdriver.ErrInvalidConfig). DDL is transactional: a failed migration
// leaves nothing behind, and those before it stay applied. Migrate is
// idempotent. It needs the privilege to create tables and indexes in the
// table's schema. See internal/pgsql's Queries.Migrate.
//
// With Config.Partitions the table is created partitioned (migrations 001
// and 002 of the partitioned layout: the partitioned table, Table +
// "_steps" and Table + "_horizons"; then the same 003 on), and Migrate
// then creates the partitions of now and Ahead buckets after it
// (EnsurePartitions). A table that exists in the other layout is an
// error matching idemdriver.ErrInvalidConfig.
func (s *Store) Migrate(ctx context.Context) error {
	dialect := sqlschema.Postgres
	if s.part != nil {
		dialect = sqlschema.PostgresPartitioned
	}
	if err := s.checkLayout(ctx); err != nil {
		return err
	}
	migs, err := sqlschema.Migrations(dialect, s.table)
	if err != nil {
		return fmt.Errorf("idempgxv5: migrations: %w", err)
	}
	if err := s.migrate(ctx, migs); err != nil {
		return err
	}
	return s.EnsurePartitions(ctx)
}

// migrate applies migs as Migrate applies the embedded migrations.
func (s *Store) migrate(ctx context.Context, migs []sqlschema.Migration) error {
	begin := func(ctx context.Context) (sqlstore.Tx, error) {
		tx, err := s.pool.Begin(ctx)
		if err != nil {
			return nil, err
		}
		return pgxTx{querier{tx}, tx}, nil
	}
	err := s.tab.V1().Migrate(ctx, begin, twoConns{querier{s.pool}, s.pool}, migs)
	s.tab.Reset() // the migrations may have changed the table's shape
	if err != nil {
		return fmt.Errorf("idempgxv5: %w", err)
	}
	return nil
}

// pgxTx is a pgx.Tx as an sqlstore.Tx.
type pgxTx struct {
	querier
	tx pgx.Tx
}

func (t pgxTx) Commit(ctx context.Context) error   { return t.tx.Commit(ctx) }
func (t pgxTx) Rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }

// twoConns runs the statements of a migration outside any transaction
// (internal/pgsql's Migrate) while another connection of pool holds the
// migration lock: with a pool of one connection it would wait for
// itself, so it refuses.
type twoConns struct {
	querier
	pool *pgxpool.Pool
}

func (c twoConns) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	if c.pool.Config().MaxConns < 2 {
		return 0, fmt.Errorf("%w: a migration that builds an index concurrently needs a pool of two connections or more", idemdriver.ErrInvalidConfig)
	}
	return c.querier.Exec(ctx, query, args...)
}

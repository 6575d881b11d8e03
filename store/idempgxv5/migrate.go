package idempgxv5

import (
	"context"
	"fmt"

	"github.com/idem-go/idem/internal/sqlschema"
	"github.com/jackc/pgx/v5"
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
// languages that write its rows) that the table has not had yet, in one transaction, and
// records each version with the server's time in Table + "_migrations"
// (version int primary key, applied_at timestamptz).
//
// The transaction first takes a transaction-level advisory lock
// (pg_advisory_xact_lock) whose key derives from the table name (the same
// key as store/idemsql's), so processes migrating the same table at once
// run one after the other; the later ones find nothing left to do. Migrate
// is idempotent. It needs the privilege to create tables and indexes in
// the table's schema.
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
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		return s.q.Migrate(ctx, querier{tx}, migs)
	})
	if err != nil {
		return fmt.Errorf("idempgxv5: %w", err)
	}
	return s.EnsurePartitions(ctx)
}

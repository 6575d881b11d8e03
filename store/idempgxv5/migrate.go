package idempgxv5

import (
	"context"
	"fmt"
	"hash/fnv"

	"github.com/idem-go/idem/internal/sqlschema"
	"github.com/jackc/pgx/v5"
)

// Migrate implements [idemdriver.Migrator]: it applies the PostgreSQL migrations
// embedded in idem (internal/sqlschema) that the table has not had yet, in
// one transaction, and records each version with the server's time in
// Table + "_migrations" (version int primary key, applied_at timestamptz).
//
// The transaction first takes a transaction-level advisory lock
// (pg_advisory_xact_lock) whose key derives from the table name, so
// processes migrating the same table at once run one after the other; the
// later ones find nothing left to do. Migrate is idempotent. It needs the
// privilege to create tables and indexes in the table's schema.
func (s *Store) Migrate(ctx context.Context) error {
	migs, err := sqlschema.Migrations(sqlschema.Postgres, s.table)
	if err != nil {
		return fmt.Errorf("idempgxv5: migrations: %w", err)
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, lockKey("migrate", s.table.Qualified)); err != nil {
			return fmt.Errorf("idempgxv5: migrate lock: %w", err)
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+s.q.migTb+` (
	version    int PRIMARY KEY,
	applied_at timestamptz NOT NULL DEFAULT now()
)`); err != nil {
			return fmt.Errorf("idempgxv5: create %s: %w", s.q.migTb, err)
		}
		rows, err := tx.Query(ctx, `SELECT version FROM `+s.q.migTb)
		if err != nil {
			return fmt.Errorf("idempgxv5: read %s: %w", s.q.migTb, err)
		}
		applied, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			return fmt.Errorf("idempgxv5: read %s: %w", s.q.migTb, err)
		}
		done := make(map[int]bool, len(applied))
		for _, v := range applied {
			done[int(v)] = true
		}
		for _, m := range migs {
			if done[m.Version] {
				continue
			}
			for _, st := range m.Statements() {
				if _, err := tx.Exec(ctx, st); err != nil {
					return fmt.Errorf("idempgxv5: migration %s: %w", m.Name, err)
				}
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+s.q.migTb+` (version, applied_at) VALUES ($1, now())`, m.Version); err != nil {
				return fmt.Errorf("idempgxv5: record migration %s: %w", m.Name, err)
			}
		}
		return nil
	})
}

// lockKey derives a 64-bit PostgreSQL advisory lock key from a purpose and
// names (FNV-1a over the NUL-separated parts), stable across processes and
// versions of idem.
func lockKey(parts ...string) int64 {
	h := fnv.New64a()
	h.Write([]byte("idem"))
	for _, p := range parts {
		h.Write([]byte{0})
		h.Write([]byte(p))
	}
	return int64(h.Sum64())
}

package main

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/idem-go/idem/store/idemsql"
)

// pgsqlDB runs on the same PostgreSQL as postgresDB (postgresURL), but
// through database/sql (pgx's stdlib driver) and store/idemsql's
// PostgreSQL dialect: the store "postgres-sql". Its best_checked is the
// same hand-written consumer on database/sql (sqlChecked; no pipelining:
// BEGIN, the claim, and a duplicate's read and ROLLBACK are a round trip
// each), so that its ratio to postgresDB's shows what database/sql
// itself costs; its figures are compared with postgresDB's (pgx and
// store/idempgxv5) measured in the same round.
type pgsqlDB struct {
	db *sql.DB
}

func newPGSQLDB(ctx context.Context, url string, maxConns int) (*pgsqlDB, error) {
	db, err := sql.Open("pgx", url)
	if err != nil {
		return nil, fmt.Errorf("postgres-sql: %w", err)
	}
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("postgres-sql: %w", err)
	}
	return &pgsqlDB{db: db}, nil
}

func (d *pgsqlDB) name() string  { return "postgres-sql" }
func (d *pgsqlDB) hasBest() bool { return false }
func (d *pgsqlDB) close()        { d.db.Close() }

func (d *pgsqlDB) newRun(ctx context.Context, tag string, f *faults) (runDB, error) {
	table := "bench_" + tag + "_sql"
	effects, checked := table+"_effects", table+"_checked"
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = d.db.ExecContext(ctx, fmt.Sprintf(`DROP TABLE IF EXISTS %s, %s, %s, %s_steps, %s_runs, %s_outbox, %s_migrations`,
			effects, checked, table, table, table, table, table))
		_, _ = d.db.ExecContext(ctx, fmt.Sprintf(`DROP FUNCTION IF EXISTS %s_outbox_notify()`, table))
	}
	fail := func(err error) (runDB, error) {
		drop()
		return nil, fmt.Errorf("postgres-sql: %w", err)
	}
	store, err := idemsql.New(d.db, idemsql.Postgres, &idemsql.Config{Table: table})
	if err != nil {
		return fail(err)
	}
	if err := store.Migrate(ctx); err != nil {
		return fail(err)
	}
	if _, err := d.db.ExecContext(ctx, `CREATE TABLE `+effects+` (id text NOT NULL)`); err != nil {
		return fail(err)
	}
	chk, err := newSQLChecked(ctx, d.db, "postgres", checked, effects, f)
	if err != nil {
		return fail(err)
	}
	insOne := `INSERT INTO ` + effects + ` (id) VALUES ($1)`
	insMany := `INSERT INTO ` + effects + ` (id) SELECT unnest($1::text[])`
	return &txRun[*sql.Tx]{
		store: store, faults: f, checked: chk,
		insertOne: func(ctx context.Context, tx *sql.Tx, id string) error {
			_, err := tx.ExecContext(ctx, insOne, id)
			return err
		},
		insertMany: func(ctx context.Context, tx *sql.Tx, ids []string) error {
			_, err := tx.ExecContext(ctx, insMany, ids)
			return err
		},
		count: func(ctx context.Context) (map[string]int, error) {
			return countRows(ctx, d.db, `SELECT id, count(*) FROM `+effects+` GROUP BY id`)
		},
		cleanup: drop,
	}, nil
}

package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"time"

	_ "github.com/go-sql-driver/mysql" // the "mysql" database/sql driver

	"github.com/idem-go/idem/store/idemsql"
)

// envMySQL names the MariaDB (or MySQL) the harness uses with --stores
// mysql, as a go-sql-driver DSN (scripts/services sets it). MariaDB is
// never among the default stores: it runs only when asked for.
const envMySQL = "IDEM_TEST_MYSQL_URL"

// mysqlDB runs on the MariaDB at envMySQL through store/idemsql, each run
// on its own tables, dropped after it.
type mysqlDB struct {
	db *sql.DB
}

func newMySQLDB(ctx context.Context, maxConns int) (*mysqlDB, error) {
	dsn := os.Getenv(envMySQL)
	if dsn == "" {
		return nil, fmt.Errorf("%w: --stores mysql needs %s", errUsage, envMySQL)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", envMySQL, err)
	}
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("mysql: %w", err)
	}
	return &mysqlDB{db: db}, nil
}

func (d *mysqlDB) name() string  { return "mysql" }
func (d *mysqlDB) hasBest() bool { return false }
func (d *mysqlDB) close()        { d.db.Close() }

// serverVersion returns the server's version and its durability settings.
func (d *mysqlDB) serverVersion(ctx context.Context) (string, error) {
	var v string
	var flush, syncBin int
	err := d.db.QueryRowContext(ctx, `SELECT VERSION(), @@innodb_flush_log_at_trx_commit, @@sync_binlog`).Scan(&v, &flush, &syncBin)
	return fmt.Sprintf("MariaDB/MySQL %s, innodb_flush_log_at_trx_commit=%d, sync_binlog=%d", v, flush, syncBin), err
}

func (d *mysqlDB) newRun(ctx context.Context, tag string, f *faults) (runDB, error) {
	table := "bench_" + tag
	effects, checked := table+"_effects", table+"_checked"
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		names := []string{effects, checked, table, table + "_steps", table + "_runs", table + "_outbox", table + "_migrations"}
		_, _ = d.db.ExecContext(ctx, `DROP TABLE IF EXISTS `+strings.Join(names, ", "))
	}
	fail := func(err error) (runDB, error) {
		drop()
		return nil, fmt.Errorf("mysql: %w", err)
	}
	store, err := idemsql.New(d.db, idemsql.MySQL, &idemsql.Config{Table: table})
	if err != nil {
		return fail(err)
	}
	if err := store.Migrate(ctx); err != nil {
		return fail(err)
	}
	if _, err := d.db.ExecContext(ctx, `CREATE TABLE `+effects+` (id VARBINARY(255) NOT NULL) ENGINE=InnoDB`); err != nil {
		return fail(err)
	}
	chk, err := newSQLChecked(ctx, d.db, "mysql", checked, effects, f)
	if err != nil {
		return fail(err)
	}
	return &txRun[*sql.Tx]{
		store: store, faults: f, checked: chk,
		insertOne: func(ctx context.Context, tx *sql.Tx, id string) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO `+effects+` (id) VALUES (?)`, id)
			return err
		},
		insertMany: func(ctx context.Context, tx *sql.Tx, ids []string) error {
			args := make([]any, len(ids))
			for i, id := range ids {
				args[i] = id
			}
			q := `INSERT INTO ` + effects + ` (id) VALUES ` + strings.TrimSuffix(strings.Repeat("(?),", len(ids)), ",")
			_, err := tx.ExecContext(ctx, q, args...)
			return err
		},
		count: func(ctx context.Context) (map[string]int, error) {
			return countRows(ctx, d.db, `SELECT id, count(*) FROM `+effects+` GROUP BY id`)
		},
		cleanup: drop,
	}, nil
}

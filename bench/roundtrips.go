package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/idem-go/idem/store/idemredis"
	"github.com/idem-go/idem/store/idemsql"
)

// envRedis names the Redis of the round-trip table (scripts/services sets
// it); MariaDB's is envMySQL.
const envRedis = "IDEM_TEST_REDIS_URL"

// roundTripStore is one lease store of the round-trip table, with what
// drops its tables or keys.
type roundTripStore struct {
	name    string
	store   idemdriver.LeaseStore
	cleanup func()
	// wal, on PostgreSQL, returns the server's WAL position in bytes
	// (pg_current_wal_lsn), for the WAL written per message.
	wal func(ctx context.Context) (int64, error)
}

// openRoundTripStores opens the lease stores of the round-trip table:
// memory and SQLite always, PostgreSQL through pgx and through
// database/sql when a PostgreSQL URL is set (postgresURL), MariaDB/MySQL
// when IDEM_TEST_MYSQL_URL is, and Redis when IDEM_TEST_REDIS_URL is,
// each on tables (or a key prefix) of its own.
func openRoundTripStores(ctx context.Context) ([]roundTripStore, func(), error) {
	var stores []roundTripStore
	closeAll := func() {
		for i := len(stores) - 1; i >= 0; i-- {
			stores[i].cleanup()
		}
	}
	fail := func(err error) ([]roundTripStore, func(), error) {
		closeAll()
		return nil, nil, err
	}
	var rb [4]byte
	_, _ = rand.Read(rb[:])
	table := "idem_rt_" + hex.EncodeToString(rb[:])
	stores = append(stores, roundTripStore{name: "memory", store: idem.NewMemoryStore(nil), cleanup: func() {}})

	dir, err := os.MkdirTemp("", "idem-bench-rt-")
	if err != nil {
		return fail(err)
	}
	db, err := sql.Open("sqlite", idemsql.SQLiteDSN(filepath.Join(dir, "rt.db")))
	if err != nil {
		return fail(err)
	}
	s, err := sqlStore(ctx, db, idemsql.SQLite, table, func() { _ = db.Close(); _ = os.RemoveAll(dir) })
	if err != nil {
		return fail(err)
	}
	stores = append(stores, s)

	if u := postgresURL(); u != "" {
		pool, err := pgxpool.New(ctx, u)
		if err != nil {
			return fail(fmt.Errorf("postgres: %w", err))
		}
		ps, err := idempgxv5.New(pool, &idempgxv5.Config{Table: table + "_pgx"})
		if err == nil {
			err = ps.Migrate(ctx)
		}
		if err != nil {
			pool.Close()
			return fail(fmt.Errorf("postgres (pgx): %w", err))
		}
		stores = append(stores, roundTripStore{name: "postgres (pgx)", store: ps, cleanup: func() {
			dropTables(func(q string) error { _, err := pool.Exec(context.Background(), q); return err }, table+"_pgx")
			pool.Close()
		}, wal: func(ctx context.Context) (n int64, err error) {
			err = pool.QueryRow(ctx, `SELECT pg_current_wal_lsn() - '0/0'::pg_lsn`).Scan(&n)
			return n, err
		}})
		db, err := sql.Open("pgx", u)
		if err != nil {
			return fail(err)
		}
		s, err := sqlStore(ctx, db, idemsql.Postgres, table+"_sql", func() { _ = db.Close() })
		if err != nil {
			return fail(fmt.Errorf("postgres (database/sql): %w", err))
		}
		s.name = "postgres (database/sql)"
		stores = append(stores, s)
	}
	if u := os.Getenv(envMySQL); u != "" {
		cfg, err := mysql.ParseDSN(u)
		if err != nil {
			return fail(fmt.Errorf("%s: %w", envMySQL, err))
		}
		db, err := sql.Open("mysql", cfg.FormatDSN())
		if err != nil {
			return fail(err)
		}
		s, err := sqlStore(ctx, db, idemsql.MySQL, table, func() { _ = db.Close() })
		if err != nil {
			return fail(fmt.Errorf("mariadb: %w", err))
		}
		s.name = "mariadb"
		stores = append(stores, s)
	}
	if u := os.Getenv(envRedis); u != "" {
		opt, err := redis.ParseURL(u)
		if err != nil {
			return fail(fmt.Errorf("%s: %w", envRedis, err))
		}
		client := redis.NewClient(opt)
		prefix := table + ":"
		rs, err := idemredis.New(client, &idemredis.Config{Prefix: prefix})
		if err != nil {
			_ = client.Close()
			return fail(fmt.Errorf("redis: %w", err))
		}
		stores = append(stores, roundTripStore{name: "redis", store: rs, cleanup: func() {
			ctx := context.Background()
			iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
			for iter.Next(ctx) {
				client.Del(ctx, iter.Val())
			}
			_ = client.Close()
		}})
	}
	return stores, closeAll, nil
}

// sqlStore migrates an idemsql store on db under table; its cleanup drops
// the tables and then runs closeDB.
func sqlStore(ctx context.Context, db *sql.DB, d idemsql.Dialect, table string, closeDB func()) (roundTripStore, error) {
	s, err := idemsql.New(db, d, &idemsql.Config{Table: table})
	if err == nil {
		err = s.Migrate(ctx)
	}
	if err != nil {
		closeDB()
		return roundTripStore{}, err
	}
	return roundTripStore{name: string(d), store: s, cleanup: func() {
		if d != idemsql.SQLite {
			dropTables(func(q string) error { _, err := db.ExecContext(context.Background(), q); return err }, table)
		}
		closeDB()
	}}, nil
}

// dropTables drops the tables of table (the processed table, its steps,
// runs, migrations and outbox), ignoring errors: a failed drop leaves a
// table of a name no other run uses.
func dropTables(exec func(q string) error, table string) {
	for _, t := range []string{table + "_steps", table + "_runs", table + "_migrations", table + "_outbox", table} {
		_ = exec("DROP TABLE IF EXISTS " + t + " CASCADE")
	}
	// PostgreSQL's outbox also has a function and domains.
	_ = exec("DROP FUNCTION IF EXISTS " + table + "_outbox_notify() CASCADE")
	_ = exec("DROP DOMAIN IF EXISTS " + table + "_outbox_id, " + table + "_outbox_str CASCADE")
}

// runRoundTrips prints, for every store openRoundTripStores opens, lease
// mode's store calls per message (idemtest.MeasureRoundTrips over n
// messages per case, one at a time) with the store's StepRecorder
// capability ("now") and with it hidden ("before": a store without it,
// as every store was before it existed), and the wall time per new
// message of each, as a Markdown table.
func runRoundTrips(ctx context.Context, w, log io.Writer, n int) error {
	stores, closeAll, err := openRoundTripStores(ctx)
	if err != nil {
		return err
	}
	defer closeAll()
	var b strings.Builder
	b.WriteString("| store | new message: calls | duplicate | release | new message before: calls | duplicate before | release before | new ms | new ms before |\n")
	b.WriteString("|---|---|---:|---|---|---:|---|---:|---:|\n")
	var wals []string
	for _, s := range stores {
		if log != nil {
			fmt.Fprintf(log, "round trips: %s\n", s.name)
		}
		var now, before idemtest.RoundTrips
		var walNow, walBefore int64
		// Before, then now, then before again: the first run of a store
		// warms its connections and statement caches.
		for i, hide := range []bool{true, false, true} {
			var w0, w1 int64
			if s.wal != nil {
				if w0, err = s.wal(ctx); err != nil {
					return err
				}
			}
			rt, err := idemtest.MeasureRoundTrips(ctx, s.store, fmt.Sprintf("rt-%d", i), n, hide)
			if err != nil {
				return fmt.Errorf("round trips on %s: %w", s.name, err)
			}
			if s.wal != nil {
				if w1, err = s.wal(ctx); err != nil {
					return err
				}
			}
			if hide {
				before, walBefore = rt, w1-w0
			} else {
				now, walNow = rt, w1-w0
			}
		}
		if s.wal != nil {
			wals = append(wals, fmt.Sprintf("%s: WAL bytes per message (a new one, a duplicate and a release, together): %.0f now, %.0f before",
				s.name, float64(walNow)/float64(n), float64(walBefore)/float64(n)))
		}
		cell := func(rt idemtest.RoundTrips, c idemtest.Calls) string {
			return fmt.Sprintf("%.3g (%s)", rt.PerMessage(c), c.PerMessage(rt.Messages))
		}
		fmt.Fprintf(&b, "| %s | %s | %.3g | %s | %s | %.3g | %s | %.3f | %.3f |\n", s.name,
			cell(now, now.New), now.PerMessage(now.Duplicate), cell(now, now.Release),
			cell(before, before.New), before.PerMessage(before.Duplicate), cell(before, before.Release),
			float64(now.NewTime)/float64(time.Millisecond), float64(before.NewTime)/float64(time.Millisecond))
	}
	for _, l := range wals {
		b.WriteString("\n" + l + "\n")
	}
	_, err = io.WriteString(w, b.String())
	return err
}

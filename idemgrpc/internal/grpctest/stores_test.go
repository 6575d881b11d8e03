package grpctest

// Every lease store the interceptor runs on, each opened twice on the same
// records (a second handle stands for a second process).

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // the "mysql" database/sql driver
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite" // the "sqlite" database/sql driver

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/idem-go/idem/store/idemredis"
	"github.com/idem-go/idem/store/idemsql"
)

// storeKind opens one kind of store: first and second share the records.
type storeKind struct {
	name string
	open func(t *testing.T) (first, second idemdriver.LeaseStore)
}

var storeKinds = []storeKind{
	{"memory", func(t *testing.T) (idemdriver.LeaseStore, idemdriver.LeaseStore) {
		s := idem.NewMemoryStore(nil)
		return s, s
	}},
	{"sqlite", func(t *testing.T) (idemdriver.LeaseStore, idemdriver.LeaseStore) {
		dsn := idemsql.SQLiteDSN(filepath.Join(t.TempDir(), "idem.db"))
		return openSQL(t, "sqlite", dsn, idemsql.SQLite, 4)
	}},
	{"postgres-idemsql", func(t *testing.T) (idemdriver.LeaseStore, idemdriver.LeaseStore) {
		return openSQL(t, "pgx", testenv.URL(t, testenv.PostgresEnv, "postgres://idem:idem@127.0.0.1:5432/idem_test"), idemsql.Postgres, 8)
	}},
	{"mariadb-idemsql", func(t *testing.T) (idemdriver.LeaseStore, idemdriver.LeaseStore) {
		return openSQL(t, "mysql", testenv.URL(t, testenv.MySQLEnv, "idem:idem@tcp(127.0.0.1:3306)/idem_test?parseTime=true"), idemsql.MySQL, 8)
	}},
	{"postgres-idempgxv5", openPgx},
	{"redis", openRedis},
}

func randName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

func bg(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// dropTables drops the store's tables at cleanup with exec.
func dropTables(t *testing.T, table string, exec func(ctx context.Context, q string) error) {
	t.Cleanup(func() {
		for _, tb := range []string{table, table + "_steps", table + "_migrations"} {
			if err := exec(context.Background(), "DROP TABLE IF EXISTS "+tb); err != nil {
				t.Errorf("drop %s: %v", tb, err)
			}
		}
	})
}

// openSQL opens an idemsql store twice on a fresh table.
func openSQL(t *testing.T, driver, dsn string, d idemsql.Dialect, conns int) (idemdriver.LeaseStore, idemdriver.LeaseStore) {
	table := randName("idem_grpc_")
	var stores [2]*idemsql.Store
	var dbs [2]*sql.DB
	for i := range stores {
		db, err := sql.Open(driver, dsn)
		if err != nil {
			t.Fatalf("open %s: %v", driver, err)
		}
		db.SetMaxOpenConns(conns)
		t.Cleanup(func() { db.Close() })
		if stores[i], err = idemsql.New(db, d, &idemsql.Config{Table: table}); err != nil {
			t.Fatalf("idemsql.New: %v", err)
		}
		dbs[i] = db
	}
	if err := stores[0].Migrate(bg(t)); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if driver != "sqlite" {
		dropTables(t, table, func(ctx context.Context, q string) error { _, err := dbs[0].ExecContext(ctx, q); return err })
	}
	return stores[0], stores[1]
}

func openPgx(t *testing.T) (idemdriver.LeaseStore, idemdriver.LeaseStore) {
	u := testenv.URL(t, testenv.PostgresEnv, "postgres://idem:idem@127.0.0.1:5432/idem_test")
	table := randName("idem_grpc_")
	var stores [2]*idempgxv5.Store
	var pools [2]*pgxpool.Pool
	for i := range stores {
		cfg, err := pgxpool.ParseConfig(u)
		if err != nil {
			t.Fatalf("parse %s: %v", testenv.PostgresEnv, err)
		}
		cfg.MaxConns = 8
		if pools[i], err = pgxpool.NewWithConfig(bg(t), cfg); err != nil {
			t.Fatalf("pool: %v", err)
		}
		t.Cleanup(pools[i].Close)
		if stores[i], err = idempgxv5.New(pools[i], &idempgxv5.Config{Table: table}); err != nil {
			t.Fatalf("idempgxv5.New: %v", err)
		}
	}
	if err := stores[0].Migrate(bg(t)); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	dropTables(t, table, func(ctx context.Context, q string) error { _, err := pools[0].Exec(ctx, q); return err })
	return stores[0], stores[1]
}

func openRedis(t *testing.T) (idemdriver.LeaseStore, idemdriver.LeaseStore) {
	opts, err := redis.ParseURL(testenv.URL(t, testenv.RedisEnv, "redis://127.0.0.1:6379/0"))
	if err != nil {
		t.Fatalf("parse %s: %v", testenv.RedisEnv, err)
	}
	prefix := randName("idemgrpc-test:") + ":"
	var stores [2]*idemredis.Store
	var clients [2]*redis.Client
	for i := range stores {
		clients[i] = redis.NewClient(opts)
		if stores[i], err = idemredis.New(clients[i], &idemredis.Config{Prefix: prefix}); err != nil {
			t.Fatalf("idemredis.New: %v", err)
		}
	}
	t.Cleanup(func() {
		ctx := context.Background()
		iter := clients[0].Scan(ctx, 0, strings.ReplaceAll(prefix, "*", "\\*")+"*", 1000).Iterator()
		for iter.Next(ctx) {
			clients[0].Unlink(ctx, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Errorf("cleanup of %s*: %v", prefix, err)
		}
		for _, c := range clients {
			c.Close()
		}
	})
	return stores[0], stores[1]
}

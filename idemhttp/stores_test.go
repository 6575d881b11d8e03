package idemhttp

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite" // the "sqlite" database/sql driver

	_ "github.com/go-sql-driver/mysql" // the "mysql" database/sql driver
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/idem-go/idem/store/idemredis"
	"github.com/idem-go/idem/store/idemsql"
)

// Environment variables naming the test servers (TESTING.md).
const (
	envPostgres   = "IDEM_TEST_POSTGRES_URL"
	envMySQL      = "IDEM_TEST_MYSQL_URL"
	envRedis      = "IDEM_TEST_REDIS_URL"
	envRequireAll = "IDEM_TEST_REQUIRE_ALL"
)

// testServerURL returns the URL in env, skipping the test when it is unset,
// or failing it under IDEM_TEST_REQUIRE_ALL=1.
func testServerURL(t testing.TB, env string) string {
	t.Helper()
	u := os.Getenv(env)
	if u == "" {
		msg := fmt.Sprintf("missing environment variable %s: set it to run against that server (scripts/services prints it)", env)
		if os.Getenv(envRequireAll) == "1" {
			t.Fatalf("%s; %s=1 requires every server", msg, envRequireAll)
		}
		t.Skip(msg)
	}
	return u
}

func testRandName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// testStoreEnv is one store under test: store, and second, another handle
// on the same records (a second process: its own connection pool or
// client).
type testStoreEnv struct {
	store, second idemdriver.LeaseStore
}

// testStore opens a store kind. Each call gives fresh tables (or a fresh
// Redis prefix), dropped at cleanup; tests isolate further by namespace.
type testStore struct {
	name string
	open func(t testing.TB) testStoreEnv
	// perTest says open is cheap and private (an in-process store): the
	// scenario runner opens one per scenario instead of sharing one,
	// so that SQLite's single writer is not shared by every scenario.
	perTest bool
}

// testStores is every store the middleware runs on.
var testStores = []testStore{
	{"memory", func(t testing.TB) testStoreEnv {
		s := idem.NewMemoryStore(nil)
		return testStoreEnv{store: s, second: s}
	}, true},
	{"sqlite", func(t testing.TB) testStoreEnv {
		path := filepath.Join(t.TempDir(), "idem.db")
		open := func() *idemsql.Store {
			db, err := sql.Open("sqlite", idemsql.SQLiteDSN(path))
			if err != nil {
				t.Fatalf("open sqlite: %v", err)
			}
			db.SetMaxOpenConns(4)
			t.Cleanup(func() { db.Close() })
			s, err := idemsql.New(db, idemsql.SQLite, &idemsql.Config{Table: "idem_http"})
			if err != nil {
				t.Fatalf("idemsql.New: %v", err)
			}
			return s
		}
		s := open()
		if err := s.Migrate(context.Background()); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
		return testStoreEnv{store: s, second: open()}
	}, true},
	{"postgres", func(t testing.TB) testStoreEnv {
		u := testServerURL(t, envPostgres)
		table := testRandName("idem_http_")
		open := func() (*idempgxv5.Store, *pgxpool.Pool) {
			cfg, err := pgxpool.ParseConfig(u)
			if err != nil {
				t.Fatalf("parse %s: %v", envPostgres, err)
			}
			cfg.MaxConns = 12
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			if err != nil {
				t.Fatalf("pool: %v", err)
			}
			t.Cleanup(pool.Close)
			s, err := idempgxv5.New(pool, &idempgxv5.Config{Table: table})
			if err != nil {
				t.Fatalf("idempgxv5.New: %v", err)
			}
			return s, pool
		}
		s, pool := open()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.Migrate(ctx); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for _, tb := range []string{table, table + "_steps", table + "_migrations"} {
				if _, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+tb); err != nil {
					t.Errorf("drop %s: %v", tb, err)
				}
			}
		})
		second, _ := open()
		return testStoreEnv{store: s, second: second}
	}, false},
	{"mariadb", func(t testing.TB) testStoreEnv {
		u := testServerURL(t, envMySQL)
		table := testRandName("idem_http_")
		var first *sql.DB
		open := func() *idemsql.Store {
			db, err := sql.Open("mysql", u)
			if err != nil {
				t.Fatalf("open mysql: %v", err)
			}
			db.SetMaxOpenConns(12)
			t.Cleanup(func() { db.Close() })
			if first == nil {
				first = db
			}
			s, err := idemsql.New(db, idemsql.MySQL, &idemsql.Config{Table: table})
			if err != nil {
				t.Fatalf("idemsql.New: %v", err)
			}
			return s
		}
		s := open()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.Migrate(ctx); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
		db := first
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for _, tb := range []string{table, table + "_steps", table + "_migrations"} {
				if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS "+tb); err != nil {
					t.Errorf("drop %s: %v", tb, err)
				}
			}
		})
		return testStoreEnv{store: s, second: open()}
	}, false},
	{"redis", func(t testing.TB) testStoreEnv {
		opts, err := redis.ParseURL(testServerURL(t, envRedis))
		if err != nil {
			t.Fatalf("parse %s: %v", envRedis, err)
		}
		prefix := testRandName("idemhttp-test:") + ":"
		var clients []*redis.Client
		open := func() *idemredis.Store {
			c := redis.NewClient(opts)
			clients = append(clients, c)
			s, err := idemredis.New(c, &idemredis.Config{Prefix: prefix})
			if err != nil {
				t.Fatalf("idemredis.New: %v", err)
			}
			return s
		}
		s, second := open(), open()
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c := clients[0]
			iter := c.Scan(ctx, 0, strings.ReplaceAll(prefix, "*", "\\*")+"*", 1000).Iterator()
			for iter.Next(ctx) {
				c.Unlink(ctx, iter.Val())
			}
			if err := iter.Err(); err != nil {
				t.Errorf("cleanup of %s*: %v", prefix, err)
			}
			for _, c := range clients {
				c.Close()
			}
		})
		return testStoreEnv{store: s, second: second}
	}, false},
}

// errInjected is the failure a faultStore injects.
var errInjected = errors.New("injected store failure")

// faultStore wraps a real store and fails chosen calls, as an outage or
// a dead process would.
type faultStore struct {
	idemdriver.LeaseStore
	down         atomic.Bool // every call fails
	dead         atomic.Bool // Renew, Complete and Release fail (the process died)
	failComplete atomic.Int32
}

func (f *faultStore) Acquire(ctx context.Context, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	if f.down.Load() {
		return idemdriver.AcquireResult{}, errInjected
	}
	return f.LeaseStore.Acquire(ctx, p)
}

func (f *faultStore) Renew(ctx context.Context, p *idemdriver.RenewParams) error {
	if f.down.Load() || f.dead.Load() {
		return errInjected
	}
	return f.LeaseStore.Renew(ctx, p)
}

func (f *faultStore) Complete(ctx context.Context, p *idemdriver.CompleteParams) error {
	if f.down.Load() || f.dead.Load() {
		return errInjected
	}
	if f.failComplete.Load() > 0 {
		f.failComplete.Add(-1)
		return errInjected
	}
	return f.LeaseStore.Complete(ctx, p)
}

func (f *faultStore) Release(ctx context.Context, p *idemdriver.ReleaseParams) error {
	if f.down.Load() || f.dead.Load() {
		return errInjected
	}
	return f.LeaseStore.Release(ctx, p)
}

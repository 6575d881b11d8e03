package scenariotest

// The stores beside the memory store that the middleware's tests run on.

import (
	"context"
	"database/sql"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite" // the "sqlite" database/sql driver

	_ "github.com/go-sql-driver/mysql" // the "mysql" database/sql driver
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/idem-go/idem/store/idemredis"
	"github.com/idem-go/idem/store/idemsql"

	"github.com/idem-go/idem/idemhttp"
)

func init() {
	testStores = append(testStores, []testStore{
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
				// The shared server holds other tests' keys too: the scan
				// walks them all, so it gets a generous bound, and the keys
				// found go in one UNLINK per page rather than one each.
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				c := clients[0]
				iter := c.Scan(ctx, 0, strings.ReplaceAll(prefix, "*", "\\*")+"*", 1000).Iterator()
				var keys []string
				flush := func() {
					if len(keys) > 0 {
						if err := c.Unlink(ctx, keys...).Err(); err != nil {
							t.Errorf("cleanup of %s*: %v", prefix, err)
						}
						keys = keys[:0]
					}
				}
				for iter.Next(ctx) {
					if keys = append(keys, iter.Val()); len(keys) == 500 {
						flush()
					}
				}
				flush()
				if err := iter.Err(); err != nil {
					t.Errorf("cleanup of %s*: %v", prefix, err)
				}
				for _, c := range clients {
					c.Close()
				}
			})
			hand := func(upstream *url.URL) http.Handler { return newHandProxy(clients[0], prefix+"hand:", upstream) }
			return testStoreEnv{store: s, second: second, handProxy: hand, serverCPU: func() time.Duration { return redisServerCPU(t, clients[0]) }}
		}, false},
	}...)
}

// TestAdvRedisDown: a Redis store that cannot be reached answers 503 with
// Retry-After and never runs the handler; FailOpen runs it.
func TestAdvRedisDown(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	s, err := idemredis.New(c, &idemredis.Config{Prefix: "adv-down:"})
	if err != nil {
		t.Fatal(err)
	}
	for _, failOpen := range []bool{false, true} {
		var n atomic.Int64
		_, u := advServer(t, s, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n.Add(1)
			w.WriteHeader(201)
		}), idemhttp.Options{FailOpen: failOpen})
		resp, _ := advPost(t, u, `"d"`, `{}`, nil)
		if !failOpen && (resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || n.Load() != 0) {
			t.Fatalf("store down: %d, Retry-After %q, n=%d", resp.StatusCode, resp.Header.Get("Retry-After"), n.Load())
		}
		if failOpen && (resp.StatusCode != 201 || n.Load() != 1) {
			t.Fatalf("fail open: %d, n=%d", resp.StatusCode, n.Load())
		}
	}
}

// redisServerCPU returns the Redis server's CPU time so far: INFO cpu's
// used_cpu_sys plus used_cpu_user.
func redisServerCPU(t testing.TB, c *redis.Client) time.Duration {
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		t.Fatalf("INFO cpu: %v", err)
	}
	var sec float64
	for line := range strings.Lines(info) {
		for _, k := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), k); ok {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					t.Fatalf("INFO cpu: %q: %v", line, err)
				}
				sec += f
			}
		}
	}
	return time.Duration(sec * float64(time.Second))
}

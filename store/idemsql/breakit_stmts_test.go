package idemsql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/faultproxy"
	"github.com/idem-go/idem/internal/ownservice"
	"github.com/idem-go/idem/store/idemsql"
)

// ownMariaDB starts a MariaDB of the test's own (it is killed, restarted
// and reconfigured) and points envMySQL at it for newEnv. The test must
// not be parallel (t.Setenv).
func ownMariaDB(t *testing.T) *ownservice.Service {
	t.Helper()
	svc := ownservice.Start(t, "mariadb")
	t.Setenv(envMySQL, svc.URL)
	return svc
}

// rootSQL runs stmt as MariaDB's root over svc's socket and returns its
// output (tab-separated, no headers).
func rootSQL(t *testing.T, svc *ownservice.Service, stmt string) string {
	t.Helper()
	out, err := exec.Command("mariadb", "--no-defaults", "-S", filepath.Join(svc.Dir, "mariadb", "mysqld.sock"),
		"-u", "root", "-N", "-B", "-e", stmt).CombinedOutput()
	if err != nil {
		t.Fatalf("mariadb -e %q: %v\n%s", stmt, err, out)
	}
	return strings.TrimSpace(string(out))
}

// serverPrepared is the server's count of statements prepared and not
// closed, over every session.
func serverPrepared(t *testing.T, svc *ownservice.Service) int {
	t.Helper()
	out := rootSQL(t, svc, "SHOW GLOBAL STATUS LIKE 'Prepared_stmt_count'")
	_, v, _ := strings.Cut(out, "\t")
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil {
		t.Fatalf("Prepared_stmt_count: %q: %v", out, err)
	}
	return n
}

// exactlyOnce fails t unless each of n messages m-0000 ... has one effect
// row and one record of consumer.
func exactlyOnce(t *testing.T, e *env, consumer string, n int) {
	t.Helper()
	ctx := context.Background()
	var rows, distinct int
	if err := e.db.QueryRowContext(ctx, `SELECT COUNT(*), COUNT(DISTINCT `+e.keyCol()+`) FROM `+e.effects).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	records, err := e.countRecords(ctx, consumer)
	if err != nil {
		t.Fatal(err)
	}
	if rows != n || distinct != n || records != n {
		t.Errorf("effects: %d rows, %d distinct; records %d; want %d of each (0 double, 0 lost)", rows, distinct, records, n)
	}
}

// TestBreakStmtCacheMariaDB attacks the prepared statements a Store keeps
// on MariaDB (stmtCache) with a server of the test's own:
//
//   - kill -9 of the server mid-load, then a restart: the statements
//     prepared on the dead connections are prepared again on new ones;
//   - max_prepared_stmt_count far below what the pool's connections would
//     hold: the claims that cannot prepare fail as retryable errors and
//     run again, and every message is processed once;
//   - connections that live 20ms (SetConnMaxLifetime): the statements of
//     closed connections are closed on the server too (none leak);
//   - more than 64 distinct claim texts (one per lock timeout): at most 64
//     are prepared, and every claim still gives the right answer.
//
// Every case counts the effect rows and records in the database.
func TestBreakStmtCacheMariaDB(t *testing.T) {
	svc := ownMariaDB(t)

	t.Run("kill-restart", func(t *testing.T) {
		const messages, workers = 300, 6
		e := newEnv(t, idemsql.MySQL, envOptions{})
		c := e.consumer("kill")
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
		defer cancel()
		var cachedAtKill int
		rep := faultproxy.Deliver(ctx, t, faultproxy.Delivery[*sql.Tx]{
			Consumer: c, Messages: messages, Workers: workers, FaultAt: messages / 3,
			Fault: func() {
				cachedAtKill = idemsql.PreparedStatements(e.store)
				if err := svc.Kill(); err != nil {
					t.Error(err)
				}
				if err := svc.Restart(); err != nil {
					t.Error(err)
				}
			},
			Effect: func(ctx context.Context, tx *sql.Tx, id string) error { return e.writeEffect(ctx, tx, id) },
		})
		t.Logf("MariaDB killed and restarted mid-load: %v", rep)
		if cachedAtKill == 0 {
			t.Errorf("no statement prepared when the server was killed: the cache was not under attack")
		}
		if rep.Hit == 0 {
			t.Errorf("the kill hit no delivery: %v", rep)
		}
		exactlyOnce(t, e, "kill", messages)
		if n := idemsql.PreparedStatements(e.store); n != cachedAtKill {
			t.Errorf("%d statements cached after the restart, %d before: want the same ones", n, cachedAtKill)
		}
	})

	t.Run("max-prepared-stmt-count", func(t *testing.T) {
		const messages, workers, limit = 200, 4, 2
		rootSQL(t, svc, "SET GLOBAL max_prepared_stmt_count = "+strconv.Itoa(limit))
		t.Cleanup(func() { rootSQL(t, svc, "SET GLOBAL max_prepared_stmt_count = DEFAULT") })
		for _, interpolate := range []string{"false", "true"} {
			t.Run("interpolateParams="+interpolate, func(t *testing.T) {
				// Before the cache gave its statements back on MySQL
				// error 1461, they held the server's budget for good
				// without interpolateParams: every statement the driver
				// prepared (the handler's own) failed, and no message was
				// processed again after the first 198 of 200.
				e := newEnv(t, idemsql.MySQL, envOptions{mysqlParams: map[string]string{"interpolateParams": interpolate}})
				e.db.SetMaxOpenConns(workers)
				c := e.consumer("limit")
				var effectErrs atomic.Int64
				ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
				defer cancel()
				rep := faultproxy.Deliver(ctx, t, faultproxy.Delivery[*sql.Tx]{
					Consumer: c, Messages: messages, Workers: workers, FaultAt: 1, Fault: func() {},
					Effect: func(ctx context.Context, tx *sql.Tx, id string) error {
						err := e.writeEffect(ctx, tx, id)
						if err != nil {
							effectErrs.Add(1)
						}
						return err
					},
				})
				t.Logf("effect errors %d; server prepared %d; cached %d", effectErrs.Load(), serverPrepared(t, svc), idemsql.PreparedStatements(e.store))
				t.Logf("max_prepared_stmt_count=%d, interpolateParams=%s: %v", limit, interpolate, rep)
				exactlyOnce(t, e, "limit", messages)
				if n := idemsql.PreparedStatements(e.store); n != 0 {
					t.Errorf("%d statements still cached after the server refused a prepare: want the cache given up", n)
				}
				if n := serverPrepared(t, svc); n > limit {
					t.Errorf("Prepared_stmt_count %d over max_prepared_stmt_count %d", n, limit)
				}
			})
		}
	})

	t.Run("conn-churn", func(t *testing.T) {
		e := newEnv(t, idemsql.MySQL, envOptions{})
		st := churn(t, e, 300, 20*time.Millisecond)
		cached := idemsql.PreparedStatements(e.store)
		if n, bound := serverPrepared(t, svc), cached*st.MaxOpenConnections; n > bound {
			t.Errorf("Prepared_stmt_count %d after %d connections closed, %d statements cached: statements of closed connections leaked (want at most %d, on %d connections at most)", n, st.MaxLifetimeClosed, cached, bound, st.MaxOpenConnections)
		}
	})

	t.Run("wait-timeout", func(t *testing.T) {
		// The server closes each connection idle for a second: the
		// statements cached on them are gone with them. The deliveries
		// after the idle spell must not fail for it (database/sql finds
		// the closed connections and takes new ones).
		rootSQL(t, svc, "SET GLOBAL wait_timeout = 1")
		t.Cleanup(func() { rootSQL(t, svc, "SET GLOBAL wait_timeout = DEFAULT") })
		e := newEnv(t, idemsql.MySQL, envOptions{})
		e.db.SetMaxOpenConns(4)
		tc := e.consumer("idle-tx")
		lc, err := idem.NewLeaseConsumer(e.store, idem.Config{Name: "idle-lease", Lease: 30 * time.Second, PurgeInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lc.Close() })
		ctx := context.Background()
		deliver := func(round int) {
			t.Helper()
			var wg sync.WaitGroup
			for i := range 8 {
				id := fmt.Sprintf("r%d-%d", round, i)
				wg.Go(func() {
					if out, err := tc.Process(ctx, idem.Message{ID: id, Payload: []byte("p")}, e.effectHandler); out.Status != idem.Processed {
						t.Errorf("round %d, transactional %s: %v, %v; want processed at the first delivery", round, id, out.Status, err)
					}
					out, err := lc.Process(ctx, idem.Message{ID: id, Payload: []byte("p")}, func(context.Context, *idem.Attempt) (idem.Result, error) {
						return idem.Result{Body: []byte("r")}, nil
					})
					if out.Status != idem.Processed {
						t.Errorf("round %d, lease %s: %v, %v; want processed at the first delivery", round, id, out.Status, err)
					}
				})
			}
			wg.Wait()
		}
		deliver(0)
		if idemsql.PreparedStatements(e.store) == 0 {
			t.Fatal("no statement prepared after the first round")
		}
		time.Sleep(2500 * time.Millisecond) // the fault: idle past wait_timeout
		deliver(1)
		e.wantRecords("idle-tx", 16)
		e.wantRecords("idle-lease", 16)
	})

	t.Run("more-than-64-texts", func(t *testing.T) {
		const texts = 80
		e := newEnv(t, idemsql.MySQL, envOptions{})
		ctx := context.Background()
		claim := func(id string, lockTimeout time.Duration) idemdriver.ClaimResult {
			t.Helper()
			tx, err := e.store.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = e.store.Rollback(ctx, tx) }()
			res, err := e.store.ClaimTx(ctx, tx, &idemdriver.ClaimParams{Consumer: "many", MessageID: id, Fingerprint: []byte("f-" + id), LockTimeout: lockTimeout})
			if err != nil {
				t.Fatalf("claim of %s with lock timeout %v: %v", id, lockTimeout, err)
			}
			if err := e.store.Commit(ctx, tx); err != nil {
				t.Fatal(err)
			}
			return res
		}
		for round := range 3 {
			for i := range texts {
				id := fmt.Sprintf("m-%03d", i)
				res := claim(id, time.Duration(i+1)*time.Second)
				if want := round == 0; res.Claimed != want || (!want && string(res.Fingerprint) != "f-"+id) {
					t.Fatalf("round %d, claim of %s: %+v; want claimed %v (else the stored fingerprint)", round, id, res, want)
				}
			}
			if n := idemsql.PreparedStatements(e.store); n > 64 {
				t.Fatalf("round %d: %d statements prepared, want at most 64", round, n)
			}
		}
		if n := idemsql.PreparedStatements(e.store); n < 60 {
			t.Errorf("%d statements prepared after %d texts: the cache filled to %d only", n, texts, n)
		}
		e.wantRecords("many", texts)
	})
}

// TestBreakStmtCacheOneConnection runs, on MariaDB and SQLite, a
// transactional Consumer and a LeaseConsumer on one Store whose handle
// has a single connection, several deliveries of each at once: the
// statements prepared at Begin, inside the transactions and on the handle
// (the lease writes) never wait for the connection their own transaction
// holds. Every message is processed once: effect rows and records counted.
func TestBreakStmtCacheOneConnection(t *testing.T) {
	t.Parallel()
	for _, d := range []idemsql.Dialect{idemsql.MySQL, idemsql.SQLite} {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			const messages, workers = 60, 4
			e := newEnv(t, d, envOptions{})
			e.db.SetMaxOpenConns(1)
			tc := e.consumer("one-tx")
			lc, err := idem.NewLeaseConsumer(e.store, idem.Config{Name: "one-lease", Lease: 30 * time.Second, PurgeInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = lc.Close() })
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			var (
				mu       sync.Mutex
				calls    = map[string]int{}
				wg       sync.WaitGroup
				txIDs    = make(chan string)
				leaseIDs = make(chan string)
			)
			for range workers {
				wg.Go(func() {
					for id := range txIDs {
						for {
							out, err := tc.Process(ctx, idem.Message{ID: id, Payload: []byte("p")}, e.effectHandler)
							if out.Ack() {
								break
							}
							if ctx.Err() != nil {
								t.Errorf("transactional %s: %v, %v", id, out.Status, err)
								return
							}
						}
					}
				})
				wg.Go(func() {
					for id := range leaseIDs {
						for {
							out, err := lc.Process(ctx, idem.Message{ID: id, Payload: []byte("p")}, func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
								if _, err := a.Step(ctx, "call", func(context.Context) ([]byte, error) {
									mu.Lock()
									calls[id]++
									mu.Unlock()
									return []byte("ok"), nil
								}); err != nil {
									return idem.Result{}, err
								}
								return idem.Result{Body: []byte("r")}, nil
							})
							if out.Ack() {
								break
							}
							if ctx.Err() != nil {
								t.Errorf("lease %s: %v, %v", id, out.Status, err)
								return
							}
						}
					}
				})
			}
			for _, ids := range []chan string{txIDs, leaseIDs} {
				wg.Go(func() {
					defer close(ids)
					for i := range messages {
						ids <- fmt.Sprintf("m-%03d", i%(messages/2)) // each ID twice: duplicates too
					}
				})
			}
			wg.Wait()
			if ctx.Err() != nil {
				t.Fatalf("deliveries did not finish within 30s on one connection: %v", ctx.Err())
			}
			var rows, distinct int
			if err := e.db.QueryRowContext(ctx, `SELECT COUNT(*), COUNT(DISTINCT `+e.keyCol()+`) FROM `+e.effects).Scan(&rows, &distinct); err != nil {
				t.Fatal(err)
			}
			e.wantRecords("one-tx", messages/2)
			e.wantRecords("one-lease", messages/2)
			if rows != distinct {
				t.Errorf("%d effect rows for %d messages: some twice", rows, distinct)
			}
			mu.Lock()
			defer mu.Unlock()
			for id, n := range calls {
				if n != 1 {
					t.Errorf("lease message %s: external call made %d times, want 1", id, n)
				}
			}
		})
	}
}

// TestBreakStmtCacheRollback: on MariaDB and SQLite, a handler that fails
// after its effect rolls back the transaction in which the claim ran from
// its prepared statement (the statement prepared on the transaction's
// connection there); the redelivery claims again through the same
// statement and commits once. Then a message whose handler always fails
// leaves no record and no effect.
func TestBreakStmtCacheRollback(t *testing.T) {
	t.Parallel()
	for _, d := range []idemsql.Dialect{idemsql.MySQL, idemsql.SQLite} {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			const messages = 20
			e := newEnv(t, d, envOptions{})
			c := e.consumer("rb")
			ctx := context.Background()
			errOnce := errors.New("failed after the effect")
			for i := range messages {
				id := fmt.Sprintf("m-%03d", i)
				failing := func(ctx context.Context, tx *sql.Tx, m idem.Message) error {
					if err := e.writeEffect(ctx, tx, m.ID); err != nil {
						return err
					}
					return errOnce
				}
				if out, err := c.Process(ctx, idem.Message{ID: id, Payload: []byte("p")}, failing); out.Ack() || !errors.Is(err, errOnce) {
					t.Fatalf("%s, failing handler: %v, %v; want not acknowledged", id, out.Status, err)
				}
				if out, err := c.Process(ctx, idem.Message{ID: id, Payload: []byte("p")}, e.effectHandler); out.Status != idem.Processed {
					t.Fatalf("%s, redelivery: %v, %v; want processed", id, out.Status, err)
				}
				if out, err := c.Process(ctx, idem.Message{ID: id, Payload: []byte("p")}, e.effectHandler); out.Status != idem.Duplicate {
					t.Fatalf("%s, third delivery: %v, %v; want duplicate", id, out.Status, err)
				}
				if i == 1 && idemsql.PreparedStatements(e.store) == 0 {
					t.Fatalf("no statement prepared after two messages: the rollback was not through a prepared statement")
				}
			}
			e.wantRecords("rb", messages)
			var rows int
			if err := e.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+e.effects).Scan(&rows); err != nil {
				t.Fatal(err)
			}
			if rows != messages {
				t.Errorf("%d effect rows for %d messages, want one each (the failed attempts' rolled back)", rows, messages)
			}
		})
	}
}

// TestBreakStmtCacheSQLiteChurn: SQLite connections that live 5ms
// (SetConnMaxLifetime), four at once: the statements the cache keeps are
// prepared again on each new connection, and every message is processed
// once, counted in the database.
func TestBreakStmtCacheSQLiteChurn(t *testing.T) {
	t.Parallel()
	churn(t, newEnv(t, idemsql.SQLite, envOptions{}), 200, 5*time.Millisecond)
}

// churn delivers messages with four workers on e, whose connections live
// lifetime, and fails t unless each message was processed once (one
// delivery each, counted in the database), the pool churned and the cache
// held statements. It returns the pool's statistics.
func churn(t *testing.T, e *env, messages int, lifetime time.Duration) sql.DBStats {
	t.Helper()
	const workers = 4
	e.db.SetMaxOpenConns(workers)
	e.db.SetConnMaxLifetime(lifetime)
	c := e.consumer("churn")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	rep := faultproxy.Deliver(ctx, t, faultproxy.Delivery[*sql.Tx]{
		Consumer: c, Messages: messages, Workers: workers, FaultAt: 1, Fault: func() {},
		Effect: func(ctx context.Context, tx *sql.Tx, id string) error { return e.writeEffect(ctx, tx, id) },
	})
	exactlyOnce(t, e, "churn", messages)
	if rep.Deliveries != messages {
		t.Errorf("%d deliveries for %d messages (%v); want each once", rep.Deliveries, messages, rep)
	}
	st := e.db.Stats()
	t.Logf("%d connections closed for their lifetime; %d open; %d statements cached", st.MaxLifetimeClosed, st.OpenConnections, idemsql.PreparedStatements(e.store))
	if st.MaxLifetimeClosed == 0 {
		t.Errorf("no connection closed for its lifetime: the pool did not churn")
	}
	if idemsql.PreparedStatements(e.store) == 0 {
		t.Errorf("no statement prepared: the cache was not under attack")
	}
	return st
}

package idemsql_test

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idemsql"
)

// mdlEnv is a MySQL table made by migrations 001 to 005 and holding
// records, for the tests of migration 006's wait for the table's
// metadata lock.
type mdlEnv struct {
	*env
	// records is the number of records written before Migrate.
	records int
}

func newMDLEnv(t *testing.T) *mdlEnv {
	t.Helper()
	e := newEnv(t, idemsql.MySQL, envOptions{noMigrate: true})
	ctx := t.Context()
	migs := migrationsOf(t, idemsql.MySQL, e.table)
	if len(migs) < 6 || migs[5].Version != 6 {
		t.Fatalf("migrations: %d, want 006 sixth", len(migs))
	}
	if err := idemsql.MigrateWith(ctx, e.store, migs[:5]); err != nil {
		t.Fatal(err)
	}
	const n = 500
	var b strings.Builder
	args := make([]any, 0, 2*n)
	b.WriteString(`INSERT INTO ` + e.table + ` (consumer, message_id, fingerprint, processed_at) VALUES `)
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(`('c', ?, ?, UTC_TIMESTAMP(6))`)
		id := "old-" + strconv.Itoa(i)
		args = append(args, id, fp(id))
	}
	if _, err := e.db.ExecContext(ctx, b.String(), args...); err != nil {
		t.Fatal(err)
	}
	return &mdlEnv{env: e, records: n}
}

// holdTable begins a transaction that reads the table and so holds its
// shared metadata lock until the returned function ends it (a consumer
// whose handler runs long). The function is also a cleanup of t.
func (e *mdlEnv) holdTable(t *testing.T) (end func()) {
	t.Helper()
	tx, err := e.db.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := tx.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM `+e.table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	end = func() { once.Do(func() { _ = tx.Rollback() }) }
	t.Cleanup(end)
	return end
}

// nullableColumns counts the lease columns of the table that are
// nullable (3 after migration 006, 0 before).
func (e *mdlEnv) nullableColumns(t *testing.T) int {
	t.Helper()
	var n int
	err := e.db.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM information_schema.COLUMNS
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME IN ('state', 'token', 'attempt') AND IS_NULLABLE = 'YES'`, e.table).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// countC counts the records of consumer "c", every record of the tests.
func (e *mdlEnv) countC(t *testing.T) int {
	t.Helper()
	n, err := e.countRecords(t.Context(), "c")
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// recorded reports whether the migrations table records version v.
func (e *mdlEnv) recorded(t *testing.T, v int) bool {
	t.Helper()
	var n int
	if err := e.db.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM `+e.table+`_migrations WHERE version = ?`, v).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// alterWaits reports whether migration 006's ALTER TABLE is waiting for
// the table's metadata lock.
func (e *mdlEnv) alterWaits(t *testing.T) bool {
	t.Helper()
	var n int
	err := e.db.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM information_schema.PROCESSLIST
		WHERE STATE = 'Waiting for table metadata lock' AND INFO LIKE ?`, `ALTER TABLE `+e.table+`%MODIFY COLUMN state%`).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// writer inserts one record per statement (autocommit) into a table until
// stopped, timing each insert.
type writer struct {
	progress chan struct{} // signalled (without blocking) after each insert
	mu       sync.Mutex
	n        int           // inserts done
	longest  time.Duration // the longest insert
	err      error
}

func startWriter(t *testing.T, ctx context.Context, db *sql.DB, table string) (w *writer, stop func()) {
	w = &writer{progress: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			id := "w-" + strconv.Itoa(i)
			start := time.Now()
			_, err := db.ExecContext(ctx, `INSERT INTO `+table+` (consumer, message_id, fingerprint, processed_at) VALUES ('c', ?, ?, UTC_TIMESTAMP(6))`, id, fp(id))
			took := time.Since(start)
			if ctx.Err() != nil {
				return
			}
			w.mu.Lock()
			if err != nil {
				w.err = err
				w.mu.Unlock()
				return
			}
			w.n++
			w.longest = max(w.longest, took)
			w.mu.Unlock()
			select {
			case w.progress <- struct{}{}:
			default:
			}
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return w, stop
}

func (w *writer) state() (n int, longest time.Duration, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n, w.longest, w.err
}

// await waits until the writer has done k more inserts than it had when
// called, failing the test after bound.
func (w *writer) await(t *testing.T, k int, bound time.Duration) {
	t.Helper()
	from, _, _ := w.state()
	deadline := time.NewTimer(bound)
	defer deadline.Stop()
	for {
		n, _, err := w.state()
		if err != nil {
			t.Fatalf("writer: %v", err)
		}
		if n >= from+k {
			return
		}
		select {
		case <-w.progress:
		case <-deadline.C:
			t.Fatalf("writer: %d inserts in %v, want %d", n-from, bound, k)
		}
	}
}

// TestMySQLMigrateMetadataLockRetry runs Migrate to 006 while a
// transaction holds the table open (it read it and goes on) and a writer
// inserts records one by one: the ALTER TABLE waits at most about a second
// for the table's metadata lock, gives way and runs again, again and
// again, so the writer's inserts, queued behind it, are never held for
// much longer; once the transaction ends the migration completes, and
// every record, written before or during it, is there.
func TestMySQLMigrateMetadataLockRetry(t *testing.T) {
	t.Parallel()
	e := newMDLEnv(t)
	ctx := t.Context()
	end := e.holdTable(t)
	w, stop := startWriter(t, ctx, e.db, e.table)
	w.await(t, 20, 30*time.Second)

	migrated := make(chan error, 1)
	start := time.Now()
	go func() { migrated <- e.store.Migrate(ctx) }()

	// Three waits of the ALTER seen to start and end (each given way after
	// its bound, or it would still wait), the writer going on meanwhile.
	const episodes = 3
	seen, waiting := 0, false
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(60 * time.Second)
	defer deadline.Stop()
	for seen < episodes {
		select {
		case err := <-migrated:
			t.Fatalf("Migrate returned while the table was held: %v", err)
		case <-deadline.C:
			t.Fatalf("%d waits of the ALTER seen in 60s, want %d", seen, episodes)
		case <-tick.C:
		}
		now := e.alterWaits(t)
		if waiting && !now {
			seen++
		}
		waiting = now
	}
	w.await(t, 5, 30*time.Second)
	if got := e.nullableColumns(t); got != 0 {
		t.Fatalf("%d lease columns nullable while the table was held, want 0", got)
	}

	end()
	select {
	case err := <-migrated:
		if err != nil {
			t.Fatalf("Migrate: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Migrate did not end within 60s of the transaction's end")
	}
	took := time.Since(start)
	w.await(t, 5, 30*time.Second)
	stop()
	inserts, longest, err := w.state()
	if err != nil {
		t.Fatalf("writer: %v", err)
	}
	t.Logf("Migrate %v (the table held until the ALTER had given way %d times); writer: %d inserts, the longest %v", took.Round(time.Millisecond), episodes, inserts, longest.Round(time.Millisecond))
	if longest > 2*time.Second {
		t.Errorf("the writer's longest insert took %v, want at most about the ALTER's 1s bound", longest)
	}
	if got := e.nullableColumns(t); got != 3 {
		t.Errorf("%d lease columns nullable after Migrate, want 3", got)
	}
	if !e.recorded(t, 6) {
		t.Error("version 6 not recorded")
	}
	if got, want := e.countC(t), e.records+inserts; got != want {
		t.Errorf("%d records after Migrate, want %d (%d before, %d by the writer)", got, want, e.records, inserts)
	}
	var old int
	if err := e.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+e.table+` WHERE message_id LIKE 'old-%' AND state = 2 AND token = 0 AND attempt = 1`).Scan(&old); err != nil {
		t.Fatal(err)
	}
	if old != e.records {
		t.Errorf("%d records from before Migrate keep state 2, token 0, attempt 1, want %d", old, e.records)
	}
}

// TestMySQLMigrateMetadataLockGivesUp runs Migrate to 006 with a context
// that ends while a transaction holds the table throughout: it returns an
// error matching idemdriver.ErrLockTimeout and the context's, naming the
// migration, leaves the columns and the migrations table as they were,
// and leaves no pooled connection with its short lock_wait_timeout; once
// the transaction ends, Migrate completes.
func TestMySQLMigrateMetadataLockGivesUp(t *testing.T) {
	t.Parallel()
	e := newMDLEnv(t)
	ctx := t.Context()
	var saved int64
	if err := e.db.QueryRowContext(ctx, `SELECT @@GLOBAL.lock_wait_timeout`).Scan(&saved); err != nil {
		t.Fatal(err)
	}
	end := e.holdTable(t)
	// A single connection besides the holder's: Migrate's, afterwards the
	// one the checks below get.
	e.db.SetMaxOpenConns(2)

	mctx, cancel := context.WithTimeout(ctx, 3500*time.Millisecond)
	defer cancel()
	err := e.store.Migrate(mctx)
	if err == nil {
		t.Fatal("Migrate succeeded while the table was held")
	}
	if !errors.Is(err, idemdriver.ErrLockTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Migrate: %v; want an error matching idemdriver.ErrLockTimeout and context.DeadlineExceeded", err)
	}
	if !strings.Contains(err.Error(), "006_lease_columns_nullable") {
		t.Errorf("Migrate: %v; want the migration named", err)
	}
	if got := e.nullableColumns(t); got != 0 {
		t.Errorf("%d lease columns nullable after Migrate gave up, want 0", got)
	}
	if e.recorded(t, 6) {
		t.Error("version 6 recorded after Migrate gave up")
	}
	var lwt int64
	if err := e.db.QueryRowContext(ctx, `SELECT @@SESSION.lock_wait_timeout`).Scan(&lwt); err != nil {
		t.Fatal(err)
	}
	if lwt != saved {
		t.Errorf("a pooled connection's lock_wait_timeout is %d after Migrate gave up, want the server's %d", lwt, saved)
	}

	end()
	if err := e.store.Migrate(ctx); err != nil {
		t.Fatalf("Migrate after the transaction ended: %v", err)
	}
	if got := e.nullableColumns(t); got != 3 {
		t.Errorf("%d lease columns nullable after Migrate, want 3", got)
	}
	if got := e.countC(t); got != e.records {
		t.Errorf("%d records after Migrate, want %d", got, e.records)
	}
}

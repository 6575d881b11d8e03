package idemsql_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idemsql"
)

func fp(s string) []byte {
	sum := sha256.Sum256([]byte(s))
	return sum[:]
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("sqlite", idemsql.SQLiteDSN(filepath.Join(t.TempDir(), "x.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, tt := range []struct {
		name    string
		db      *sql.DB
		dialect idemsql.Dialect
		cfg     *idemsql.Config
	}{
		{"nil db", nil, idemsql.SQLite, nil},
		{"unknown dialect", db, idemsql.Dialect("oracle"), nil},
		{"table with a quote", db, idemsql.SQLite, &idemsql.Config{Table: `x"; DROP TABLE y; --`}},
		{"table too deep", db, idemsql.SQLite, &idemsql.Config{Table: "a.b.c"}},
		{"table starting with a digit", db, idemsql.SQLite, &idemsql.Config{Table: "1abc"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := idemsql.New(tt.db, tt.dialect, tt.cfg)
			if !errors.Is(err, idem.ErrInvalidConfig) {
				t.Errorf("New: err = %v, want one matching idem.ErrInvalidConfig", err)
			}
		})
	}
	s, err := idemsql.New(db, idemsql.SQLite, nil)
	if err != nil {
		t.Fatalf("New with defaults: %v", err)
	}
	if s.Table() != "idem_processed" || s.Dialect() != idemsql.SQLite {
		t.Errorf("Table, Dialect = %q, %q, want idem_processed, sqlite", s.Table(), s.Dialect())
	}
}

// TestSQLiteSettings checks that New refuses a SQLite database opened
// without the settings the store depends on, naming the setting.
func TestSQLiteSettings(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		dsn     func(path string) string
		maxOpen int
		setting string // "" = accepted
	}{
		{"SQLiteDSN", idemsql.SQLiteDSN, 0, ""},
		{"SQLiteDSN one connection", idemsql.SQLiteDSN, 1, ""},
		{"no busy timeout", func(p string) string { return "file:" + p + "?_txlock=immediate&_pragma=journal_mode(WAL)" }, 0, "busy_timeout"},
		{"rollback journal", func(p string) string { return "file:" + p + "?_txlock=immediate&_pragma=busy_timeout(5000)" }, 0, "journal_mode"},
		{"deferred transactions", func(p string) string { return "file:" + p + "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)" }, 0, "_txlock"},
		{"memory, one connection", func(string) string { return idemsql.SQLiteDSN(":memory:") }, 1, ""},
		{"memory, many connections", func(string) string { return idemsql.SQLiteDSN(":memory:") }, 0, "max open connections"},
		{"odd file name", func(p string) string { return idemsql.SQLiteDSN(filepath.Join(filepath.Dir(p), "a?b#c%20d é.db")) }, 0, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "s.db")
			db, err := sql.Open("sqlite", tt.dsn(path))
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			db.SetMaxOpenConns(tt.maxOpen)
			s, err := idemsql.New(db, idemsql.SQLite, nil)
			if tt.setting == "" {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				// The store works: migrate, claim, see the duplicate.
				if err := s.Migrate(t.Context()); err != nil {
					t.Fatalf("Migrate: %v", err)
				}
				c, err := idem.NewConsumer[*sql.Tx](s, idem.Config{Name: "c", PurgeInterval: -1})
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				noop := func(context.Context, *sql.Tx, idem.Message) error { return nil }
				msg := idem.Message{ID: "m", Payload: []byte("p")}
				if out, err := c.Process(t.Context(), msg, noop); err != nil || out.Status != idem.Processed {
					t.Fatalf("Process: %v, %v", out.Status, err)
				}
				if out, err := c.Process(t.Context(), msg, noop); err != nil || out.Status != idem.Duplicate {
					t.Fatalf("redelivery: %v, %v", out.Status, err)
				}
				return
			}
			var se *idemsql.SQLiteSettingError
			if !errors.As(err, &se) || se.Setting != tt.setting {
				t.Fatalf("New: err = %v, want a *SQLiteSettingError for %s", err, tt.setting)
			}
			if !errors.Is(err, idem.ErrInvalidConfig) {
				t.Errorf("New: err = %v does not match idem.ErrInvalidConfig", err)
			}
		})
	}
}

// TestSQLiteDSNFileName checks that SQLiteDSN escapes the path: the file
// created is the one named.
func TestSQLiteDSNFileName(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	name := filepath.Join(dir, "a?b#c%20d é.db")
	db, err := sql.Open("sqlite", idemsql.SQLiteDSN(name))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("CREATE TABLE t (x)"); err != nil {
		t.Fatal(err)
	}
	var file string
	if err := db.QueryRow("SELECT file FROM pragma_database_list WHERE name = 'main'").Scan(&file); err != nil {
		t.Fatal(err)
	}
	if file != name {
		t.Errorf("database file = %q, want %q", file, name)
	}
}

// TestDuplicateKeepsTxUsable is a duplicate claim inside
// the caller's transaction must not abort it. On PostgreSQL a caught
// unique violation would (SQLSTATE 25P02 on the next statement).
func TestDuplicateKeepsTxUsable(t *testing.T) {
	t.Parallel()
	forEachDialect(t, func(t *testing.T, d idemsql.Dialect) {
		e := newEnv(t, d, envOptions{})
		ctx := t.Context()
		c := e.consumer("c05")
		msg := idem.Message{ID: "m-1", Payload: []byte("p")}
		if _, err := c.Process(ctx, msg, e.effectHandler); err != nil {
			t.Fatalf("first delivery: %v", err)
		}
		tx, err := e.store.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer e.store.Rollback(ctx, tx)
		if err := e.writeEffect(ctx, tx, "before"); err != nil {
			t.Fatalf("effect before: %v", err)
		}
		out, err := c.ProcessTx(ctx, tx, msg, e.effectHandler)
		if err != nil || out.Status != idem.Duplicate {
			t.Fatalf("ProcessTx of a processed message: %v, %v; want Duplicate", out.Status, err)
		}
		// A mismatching payload is also settled without a database error.
		out, _ = c.ProcessTx(ctx, tx, idem.Message{ID: "m-1", Payload: []byte("other")}, e.effectHandler)
		if out.Status != idem.FingerprintMismatch {
			t.Fatalf("ProcessTx with another payload: %v, want FingerprintMismatch", out.Status)
		}
		if err := e.writeEffect(ctx, tx, "after"); err != nil {
			t.Fatalf("statement after the duplicate: %v (the transaction was aborted)", err)
		}
		// A new message in the same transaction still claims.
		if out, err := c.ProcessTx(ctx, tx, idem.Message{ID: "m-2", Payload: []byte("p")}, e.effectHandler); err != nil || out.Status != idem.Processed {
			t.Fatalf("ProcessTx of a new message: %v, %v", out.Status, err)
		}
		if err := e.store.Commit(ctx, tx); err != nil {
			t.Fatalf("Commit: %v", err)
		}
		e.wantEffects("before", 1)
		e.wantEffects("after", 1)
		e.wantEffects("m-1", 1)
		e.wantEffects("m-2", 1)
		e.wantRecords(c.Name(), 2)
	})
}

// TestByteExactIDs checks that IDs differing only in case, trailing
// space, Unicode normalisation or other collation-equal ways are distinct
// messages on every dialect, whatever the server's default collation
// TestInvalidClaimKeepsTxUsable: ClaimTx and ClaimBatchTx refuse invalid
// parameters before any statement, so the caller's transaction is not
// aborted (on PostgreSQL a CHECK violation would abort it) or left with a
// truncated row (MySQL): it keeps its writes, claims and commits.
func TestInvalidClaimKeepsTxUsable(t *testing.T) {
	t.Parallel()
	forEachDialect(t, func(t *testing.T, d idemsql.Dialect) {
		e := newEnv(t, d, envOptions{})
		ctx := t.Context()
		long := strings.Repeat("x", idemdriver.DefaultMaxIDLength+1)
		tx, err := e.store.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback() }()
		if err := e.writeEffect(ctx, tx, "before"); err != nil {
			t.Fatal(err)
		}
		if _, err := e.store.ClaimTx(ctx, tx, &idemdriver.ClaimParams{Consumer: "c", MessageID: long, Fingerprint: fp("p")}); !errors.Is(err, idemdriver.ErrInvalidMessageID) {
			t.Errorf("ClaimTx of a %d-byte ID = %v, want ErrInvalidMessageID", len(long), err)
		}
		batch := &idemdriver.ClaimBatchParams{Consumer: "c", Messages: []idemdriver.ClaimMessage{{MessageID: "ok", Fingerprint: fp("p")}, {MessageID: long, Fingerprint: fp("p")}}}
		if _, err := e.store.ClaimBatchTx(ctx, tx, batch); !errors.Is(err, idemdriver.ErrInvalidMessageID) {
			t.Errorf("ClaimBatchTx with a %d-byte ID = %v, want ErrInvalidMessageID", len(long), err)
		}
		if res, err := e.store.ClaimTx(ctx, tx, &idemdriver.ClaimParams{Consumer: "c", MessageID: "m", Fingerprint: fp("p")}); err != nil || !res.Claimed {
			t.Fatalf("valid ClaimTx after the invalid ones = %+v, %v", res, err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatalf("Commit: %v", err)
		}
		e.wantEffects("before", 1)
		e.wantRecords("c", 1)
	})
}

// (MariaDB here runs utf8mb4_general_ci, which folds all of these).
func TestByteExactIDs(t *testing.T) {
	t.Parallel()
	ids := []string{
		"abc", "ABC", "Abc", "abc ", "abc  ", " abc",
		"\u00e9", "e\u0301", "\u00c9", // é NFC, é NFD, É
		"ß", "ss", "SS", "ﬀ", "ff",
		"a\u00a0b", "a b", // no-break space vs space
		"İ", "i", "I", "ı",
		// Characters with a meaning in PostgreSQL array literals, which
		// the PostgreSQL batch claim sends its IDs in.
		"NULL", "null", `"quoted"`, `back\slash`, `\`, `"`, "a,b", "{x}", "{}", "x}", "'single'", " ",
	}
	forEachDialect(t, func(t *testing.T, d idemsql.Dialect) {
		e := newEnv(t, d, envOptions{})
		ctx := t.Context()
		c := e.consumer("bytes")
		for _, id := range ids {
			out, err := c.Process(ctx, idem.Message{ID: id, Payload: []byte("p " + id)}, e.effectHandler)
			if err != nil || out.Status != idem.Processed {
				t.Errorf("Process(%q): %v, %v; want Processed", id, out.Status, err)
			}
		}
		e.wantRecords(c.Name(), len(ids))
		for _, id := range ids {
			out, err := c.Process(ctx, idem.Message{ID: id, Payload: []byte("p " + id)}, e.effectHandler)
			if err != nil || out.Status != idem.Duplicate {
				t.Errorf("redelivery of %q: %v, %v; want Duplicate", id, out.Status, err)
			}
			rec, err := e.store.Inspect(ctx, c.Name(), id)
			if err != nil {
				t.Errorf("Inspect(%q): %v", id, err)
				continue
			}
			if rec.MessageID != id || !bytes.Equal(rec.Fingerprint, fp("p "+id)) {
				t.Errorf("Inspect(%q) = %q, %x; want the ID and its own fingerprint", id, rec.MessageID, rec.Fingerprint)
			}
		}
		// The batch path compares the same way.
		var batch []idemdriver.ClaimMessage
		for _, id := range ids {
			batch = append(batch, idemdriver.ClaimMessage{MessageID: id + "/b", Fingerprint: fp(id)})
		}
		tx, err := e.store.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		res, err := e.store.ClaimBatchTx(ctx, tx, &idemdriver.ClaimBatchParams{Consumer: c.Name(), Messages: batch})
		if err != nil {
			t.Fatalf("ClaimBatchTx: %v", err)
		}
		for i, r := range res {
			if !r.Claimed {
				t.Errorf("batch claim of %q: not claimed", batch[i].MessageID)
			}
		}
		if err := e.store.Commit(ctx, tx); err != nil {
			t.Fatal(err)
		}
		e.wantRecords(c.Name(), 2*len(ids))
		// Again: every one a duplicate with its own fingerprint (on MySQL
		// this also checks that the duplicate bitmask tells the IDs apart).
		tx, err = e.store.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer e.store.Rollback(ctx, tx)
		res, err = e.store.ClaimBatchTx(ctx, tx, &idemdriver.ClaimBatchParams{Consumer: c.Name(), Messages: batch})
		if err != nil {
			t.Fatalf("ClaimBatchTx again: %v", err)
		}
		for i, r := range res {
			if r.Claimed || !bytes.Equal(r.Fingerprint, batch[i].Fingerprint) {
				t.Errorf("batch claim of %q again: Claimed %v, fingerprint %x; want a duplicate with %x",
					batch[i].MessageID, r.Claimed, r.Fingerprint, batch[i].Fingerprint)
			}
		}
	})
}

// TestConcurrentCopies is 32 goroutines deliver the same
// message at once; exactly one effect commits, and every other delivery
// is a Duplicate (never an error). On InnoDB each duplicate holds the
// record's row lock until it rolls back, so the copies pass one by one:
// on a loaded machine the last waits longer than the default claim lock
// timeout (StoreTimeout/2), and would be InProgress; the consumer here
// waits longer, since the claim is what this test is about.
func TestConcurrentCopies(t *testing.T) {
	t.Parallel()
	forEachDialect(t, func(t *testing.T, d idemsql.Dialect) {
		e := newEnv(t, d, envOptions{})
		c, err := idem.NewConsumer[*sql.Tx](e.store, idem.Config{Name: "c03", PurgeInterval: -1, StoreTimeout: 2 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		const n = 32
		for round := range 3 {
			msg := idem.Message{ID: fmt.Sprintf("m-%d", round), Payload: []byte("p")}
			var (
				start            = make(chan struct{})
				wg               sync.WaitGroup
				processed, dupes atomic.Int64
				calls            atomic.Int64
			)
			for range n {
				wg.Go(func() {
					<-start
					out, err := c.Process(t.Context(), msg, func(ctx context.Context, tx *sql.Tx, m idem.Message) error {
						calls.Add(1)
						return e.writeEffect(ctx, tx, m.ID)
					})
					switch {
					case err != nil:
						t.Errorf("Process: %v", err)
					case out.Status == idem.Processed:
						processed.Add(1)
					case out.Status == idem.Duplicate:
						dupes.Add(1)
					}
				})
			}
			close(start)
			wg.Wait()
			if processed.Load() != 1 || dupes.Load() != n-1 || calls.Load() != 1 {
				t.Errorf("round %d: Processed %d, Duplicate %d, handler calls %d; want 1, %d, 1",
					round, processed.Load(), dupes.Load(), calls.Load(), n-1)
			}
			e.wantEffects(msg.ID, 1)
		}
	})
}

// TestClaimBatch checks ClaimBatchTx directly: new, committed, claimed
// earlier in the same transaction, and in-flight records, in input order,
// with the stored fingerprints.
func TestClaimBatch(t *testing.T) {
	t.Parallel()
	forEachDialect(t, func(t *testing.T, d idemsql.Dialect) {
		for _, params := range mysqlVariants(d) {
			t.Run(params.name, func(t *testing.T) {
				testClaimBatch(t, newEnv(t, d, envOptions{mysqlParams: params.params}))
			})
		}
	})
}

type mysqlVariant struct {
	name   string
	params map[string]string
}

// mysqlVariants returns the DSN variants worth testing: on MySQL the
// default and clientFoundRows=true (with and without server-side
// prepared statements); on the other dialects just one.
func mysqlVariants(d idemsql.Dialect) []mysqlVariant {
	if d != idemsql.MySQL {
		return []mysqlVariant{{name: "default"}}
	}
	return []mysqlVariant{
		{name: "default"},
		{name: "clientFoundRows", params: map[string]string{"clientFoundRows": "true"}},
		{name: "clientFoundRows+interpolateParams-parseTime", params: map[string]string{"clientFoundRows": "true", "interpolateParams": "true", "parseTime": "false"}},
	}
}

func testClaimBatch(t *testing.T, e *env) {
	ctx := t.Context()
	const consumer = "batch"
	claim := func(tx *sql.Tx, ids ...string) []idemdriver.ClaimResult {
		t.Helper()
		var ms []idemdriver.ClaimMessage
		for _, id := range ids {
			ms = append(ms, idemdriver.ClaimMessage{MessageID: id, Fingerprint: fp(id)})
		}
		res, err := e.store.ClaimBatchTx(ctx, tx, &idemdriver.ClaimBatchParams{Consumer: consumer, Messages: ms})
		if err != nil {
			t.Fatalf("ClaimBatchTx(%v): %v", ids, err)
		}
		if len(res) != len(ids) {
			t.Fatalf("ClaimBatchTx(%v): %d results", ids, len(res))
		}
		return res
	}
	want := func(what string, res []idemdriver.ClaimResult, ids []string, claimed string) {
		t.Helper()
		for i, r := range res {
			wantClaimed := claimed[i] == 'c'
			if r.Claimed != wantClaimed {
				t.Errorf("%s: %q Claimed = %v, want %v", what, ids[i], r.Claimed, wantClaimed)
			}
			if !wantClaimed && !bytes.Equal(r.Fingerprint, fp(ids[i])) {
				t.Errorf("%s: %q stored fingerprint = %x, want %x", what, ids[i], r.Fingerprint, fp(ids[i]))
			}
		}
	}
	// Commit a and c.
	tx, _ := e.store.Begin(ctx)
	ids := []string{"c", "a"}
	want("first batch", claim(tx, ids...), ids, "cc")
	if err := e.store.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	// All duplicates.
	tx, _ = e.store.Begin(ctx)
	ids = []string{"a", "c"}
	want("all duplicates", claim(tx, ids...), ids, "dd")
	e.store.Rollback(ctx, tx)
	// Mixed, out of order, plus a message claimed earlier in the same tx.
	tx, _ = e.store.Begin(ctx)
	r, err := e.store.ClaimTx(ctx, tx, &idemdriver.ClaimParams{Consumer: consumer, MessageID: "e", Fingerprint: fp("e")})
	if err != nil || !r.Claimed {
		t.Fatalf("ClaimTx(e): %v, %v", r, err)
	}
	ids = []string{"d", "c", "b", "e", "a", "f"}
	want("mixed", claim(tx, ids...), ids, "cdcddc")
	if err := e.store.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	e.wantRecords(consumer, 6)

	// In flight: tx1 holds b2 and b3 uncommitted; tx2 claims b1..b4 and
	// waits. After tx1 commits, tx2 sees b2, b3 as duplicates.
	tx1, _ := e.store.Begin(ctx)
	ids = []string{"b2", "b3"}
	want("tx1", claim(tx1, ids...), ids, "cc")
	done := make(chan []idemdriver.ClaimResult)
	go func() {
		tx2, err := e.store.Begin(ctx)
		if err != nil {
			t.Error(err)
			close(done)
			return
		}
		defer e.store.Rollback(ctx, tx2)
		var ms []idemdriver.ClaimMessage
		for _, id := range []string{"b4", "b3", "b2", "b1"} {
			ms = append(ms, idemdriver.ClaimMessage{MessageID: id, Fingerprint: fp(id)})
		}
		res, err := e.store.ClaimBatchTx(ctx, tx2, &idemdriver.ClaimBatchParams{Consumer: consumer, Messages: ms})
		if err != nil {
			t.Errorf("tx2 ClaimBatchTx: %v", err)
		}
		if err := e.store.Commit(ctx, tx2); err != nil {
			t.Errorf("tx2 Commit: %v", err)
		}
		done <- res
	}()
	if e.dialect == idemsql.SQLite {
		// SQLite's tx2 waits at BEGIN IMMEDIATE: nothing to race.
		if err := e.store.Commit(ctx, tx1); err != nil {
			t.Fatal(err)
		}
	} else {
		waitBlocked(t, e)
		if err := e.store.Commit(ctx, tx1); err != nil {
			t.Fatal(err)
		}
	}
	res := <-done
	if res != nil {
		want("tx2 after tx1 committed", res, []string{"b4", "b3", "b2", "b1"}, "cddc")
	}
	e.wantRecords(consumer, 10)

	// A batch past the placeholder limits, half of it processed before.
	tx, _ = e.store.Begin(ctx)
	var big []string
	for i := range 2500 {
		big = append(big, fmt.Sprintf("big-%05d", i))
	}
	var evens []string
	for i := 0; i < len(big); i += 2 {
		evens = append(evens, big[i])
	}
	claim(tx, evens...)
	if err := e.store.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	tx, _ = e.store.Begin(ctx)
	pattern := strings.Repeat("dc", len(big)/2)
	want("big batch", claim(tx, big...), big, pattern)
	if err := e.store.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	e.wantRecords(consumer, 10+len(big))
}

// waitBlocked waits until another session runs a statement on the env's
// table that waits for a lock, so a test can order "tx2 blocks on tx1's
// rows" before tx1 commits. It polls the server (no sleep-and-hope); the
// timeout only turns a hang into a failure.
func waitBlocked(t *testing.T, e *env) {
	t.Helper()
	var query string
	switch e.dialect {
	case idemsql.Postgres:
		query = `SELECT count(*) FROM pg_stat_activity
	WHERE wait_event_type = 'Lock' AND datname = current_database() AND query LIKE '%' || $1 || '%' AND pid <> pg_backend_pid()`
	case idemsql.MySQL:
		// Without the PROCESS privilege a session sees its user's own
		// threads: an INSERT (or INSERT IGNORE) on the table still
		// running is one waiting.
		query = `SELECT COUNT(*) FROM information_schema.processlist
	WHERE info LIKE CONCAT('%INSERT%INTO ', ?, ' %') AND id <> CONNECTION_ID()`
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var n int
		if err := e.db.QueryRowContext(t.Context(), query, e.table).Scan(&n); err != nil {
			t.Fatalf("waiting for a lock wait: %v", err)
		}
		if n > 0 {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("no transaction waited for a lock on %s within 30s", e.table)
}

// TestMySQLClientFoundRows checks single claims under clientFoundRows=true,
// where rows affected says 1 for a duplicate as for a new row.
func TestMySQLClientFoundRows(t *testing.T) {
	t.Parallel()
	for _, v := range mysqlVariants(idemsql.MySQL) {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, idemsql.MySQL, envOptions{mysqlParams: v.params})
			c := e.consumer("found-rows")
			ctx := t.Context()
			msg := idem.Message{ID: "m", Payload: []byte("p")}
			for i, want := range []idem.Status{idem.Processed, idem.Duplicate, idem.Duplicate} {
				out, err := c.Process(ctx, msg, e.effectHandler)
				if out.Status != want || err != nil {
					t.Errorf("delivery %d: %v, %v; want %v", i, out.Status, err, want)
				}
			}
			out, _ := c.Process(ctx, idem.Message{ID: "m", Payload: []byte("other")}, e.effectHandler)
			if out.Status != idem.FingerprintMismatch {
				t.Errorf("other payload: %v, want FingerprintMismatch", out.Status)
			}
			e.wantEffects("m", 1)
		})
	}
}

// TestRollbackAfterCommit checks that Rollback of an ended transaction,
// including after a failed Commit, returns nil.
func TestRollbackAfterCommit(t *testing.T) {
	t.Parallel()
	forEachDialect(t, func(t *testing.T, d idemsql.Dialect) {
		e := newEnv(t, d, envOptions{})
		ctx := t.Context()
		tx, err := e.store.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.store.Commit(ctx, tx); err != nil {
			t.Fatal(err)
		}
		if err := e.store.Rollback(ctx, tx); err != nil {
			t.Errorf("Rollback after Commit: %v", err)
		}
		if err := e.store.Commit(ctx, tx); err == nil {
			t.Errorf("second Commit: nil error")
		}
		if err := e.store.Rollback(ctx, tx); err != nil {
			t.Errorf("Rollback after a failed Commit: %v", err)
		}
		// A transaction whose context was cancelled is rolled back by
		// database/sql; Rollback is still nil and nothing committed.
		cctx, cancel := context.WithCancel(ctx)
		tx, err = e.store.Begin(cctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.store.ClaimTx(cctx, tx, &idemdriver.ClaimParams{Consumer: "c", MessageID: "m", Fingerprint: fp("m")}); err != nil {
			t.Fatal(err)
		}
		cancel()
		if err := e.store.Commit(ctx, tx); err == nil {
			t.Errorf("Commit after cancel: nil error")
		}
		// Nil, or the driver's report that it could not send ROLLBACK with
		// the cancelled context (pgx then closes the connection).
		if err := e.store.Rollback(ctx, tx); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Rollback after cancel: %v", err)
		}
		e.wantRecords("c", 0)
	})
}

// TestMigrate runs Migrate again, and many times at once on fresh
// tables: every call succeeds and each version (001 and 002 so far) is
// recorded once.
func TestMigrate(t *testing.T) {
	t.Parallel()
	forEachDialect(t, func(t *testing.T, d idemsql.Dialect) {
		e := newEnv(t, d, envOptions{noMigrate: true})
		ctx := t.Context()
		const n = 8
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range n {
			wg.Go(func() {
				<-start
				if err := e.store.Migrate(ctx); err != nil {
					t.Errorf("concurrent Migrate: %v", err)
				}
			})
		}
		close(start)
		wg.Wait()
		if err := e.store.Migrate(ctx); err != nil {
			t.Fatalf("Migrate again: %v", err)
		}
		var versions, distinct int
		var appliedAt any
		if err := e.db.QueryRowContext(ctx, `SELECT COUNT(*), COUNT(DISTINCT version), MAX(applied_at) FROM `+e.table+`_migrations`).Scan(&versions, &distinct, &appliedAt); err != nil {
			t.Fatal(err)
		}
		want := len(migrationsOf(t, d, e.table))
		if versions != want || distinct != want || appliedAt == nil {
			t.Errorf("migrations table: %d rows, %d versions, applied_at %v; want %d, %d, set", versions, distinct, appliedAt, want, want)
		}
		// The migrated table works.
		c := e.consumer("m")
		if out, err := c.Process(ctx, idem.Message{ID: "x", Payload: []byte("p")}, e.effectHandler); err != nil || out.Status != idem.Processed {
			t.Fatalf("Process after Migrate: %v, %v", out.Status, err)
		}
	})
}

// TestInspectAndStats checks the operator reads: a record's fields, a
// missing record, invalid names, and per-consumer statistics.
func TestInspectAndStats(t *testing.T) {
	t.Parallel()
	forEachDialect(t, func(t *testing.T, d idemsql.Dialect) {
		e := newEnv(t, d, envOptions{})
		ctx := t.Context()
		before := time.Now().Add(-time.Minute) // the server's clock may differ a little
		for _, name := range []string{"b-consumer", "a-consumer"} {
			c := e.consumer(name)
			for i := range 3 {
				id := fmt.Sprintf("m%d", i)
				if _, err := c.Process(ctx, idem.Message{ID: id, Payload: []byte(id)}, e.effectHandler); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := e.ageRecords(ctx, "a-consumer", []string{"m0"}, time.Hour); err != nil {
			t.Fatal(err)
		}
		rec, err := e.store.Inspect(ctx, "a-consumer", "m1")
		if err != nil {
			t.Fatalf("Inspect: %v", err)
		}
		if rec.Consumer != "a-consumer" || rec.MessageID != "m1" || !bytes.Equal(rec.Fingerprint, fp("m1")) ||
			rec.ProcessedAt.Before(before) || rec.ProcessedAt.After(time.Now().Add(time.Minute)) || rec.ProcessedAt.Location() != time.UTC {
			t.Errorf("Inspect = %+v", rec)
		}
		if _, err := e.store.Inspect(ctx, "a-consumer", "M1"); !errors.Is(err, idemdriver.ErrNotFound) {
			t.Errorf("Inspect of a missing record: err = %v, want ErrNotFound", err)
		}
		if _, err := e.store.Inspect(ctx, "a-consumer", ""); !errors.Is(err, idem.ErrMissingMessageID) {
			t.Errorf("Inspect with an empty ID: err = %v", err)
		}
		if _, err := e.store.Inspect(ctx, "", "m1"); !errors.Is(err, idem.ErrInvalidConsumerName) {
			t.Errorf("Inspect with an empty consumer: err = %v", err)
		}
		stats, err := e.store.Stats(ctx)
		if err != nil {
			t.Fatalf("Stats: %v", err)
		}
		if len(stats) != 2 || stats[0].Consumer != "a-consumer" || stats[1].Consumer != "b-consumer" {
			t.Fatalf("Stats = %+v, want a-consumer then b-consumer", stats)
		}
		a := stats[0]
		if a.Count != 3 || a.Newest.Sub(a.Oldest) < 59*time.Minute || a.Newest.Sub(a.Oldest) > 61*time.Minute {
			t.Errorf("Stats[a] = %+v, want 3 records spanning an hour", a)
		}
		m0, _ := e.store.Inspect(ctx, "a-consumer", "m0")
		if !a.Oldest.Equal(m0.ProcessedAt) {
			t.Errorf("Stats[a].Oldest = %v, Inspect(m0).ProcessedAt = %v", a.Oldest, m0.ProcessedAt)
		}
	})
}

// TestPurgeLock checks that one cleaner runs at a time per (table,
// consumer): a purge paused in OnBatch holds the lock, a second purge of
// the same consumer (through another Store and, on servers, another pool)
// gets ErrPurgeInProgress, another consumer is not blocked, and claims go
// on meanwhile.
func TestPurgeLock(t *testing.T) {
	t.Parallel()
	forEachDialect(t, func(t *testing.T, d idemsql.Dialect) {
		e := newEnv(t, d, envOptions{})
		ctx := t.Context()
		c := e.consumer("locked")
		var ids []string
		for i := range 4 {
			id := fmt.Sprintf("m%d", i)
			ids = append(ids, id)
			if _, err := c.Process(ctx, idem.Message{ID: id, Payload: []byte(id)}, e.effectHandler); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.ageRecords(ctx, c.Name(), ids[:3], 48*time.Hour); err != nil {
			t.Fatal(err)
		}
		// A second Store on the same tables: on servers through its own pool.
		db2 := e.db
		if d != idemsql.SQLite {
			db2 = openDB(t, d, envOptions{})
		}
		s2, err := idemsql.New(db2, d, &idemsql.Config{Table: e.table})
		if err != nil {
			t.Fatal(err)
		}
		paused, resume := make(chan struct{}), make(chan struct{})
		done := make(chan error)
		go func() {
			first := true
			_, err := purge(ctx, e.store, &idem.PurgeParams{Consumer: c.Name(), RetentionWindow: time.Hour, BatchSize: 1,
				OnBatch: func(int64) {
					if first {
						first = false
						close(paused)
						<-resume
					}
				}})
			done <- err
		}()
		<-paused
		if _, err := purge(ctx, s2, &idem.PurgeParams{Consumer: c.Name(), RetentionWindow: time.Hour, BatchSize: 1}); !errors.Is(err, idem.ErrPurgeInProgress) {
			t.Errorf("second cleaner: err = %v, want ErrPurgeInProgress", err)
		}
		if _, err := purge(ctx, s2, &idem.PurgeParams{Consumer: "another", RetentionWindow: time.Hour, BatchSize: 1}); err != nil {
			t.Errorf("cleaner of another consumer: %v", err)
		}
		if out, err := c.Process(ctx, idem.Message{ID: "during", Payload: []byte("p")}, e.effectHandler); err != nil || out.Status != idem.Processed {
			t.Errorf("Process during a purge: %v, %v", out.Status, err)
		}
		close(resume)
		if err := <-done; err != nil {
			t.Errorf("first cleaner: %v", err)
		}
		e.wantRecords(c.Name(), 2)
		// The lock is free again.
		if _, err := purge(ctx, s2, &idem.PurgeParams{Consumer: c.Name(), RetentionWindow: time.Hour, BatchSize: 1}); err != nil {
			t.Errorf("purge after the first ended: %v", err)
		}
	})
}

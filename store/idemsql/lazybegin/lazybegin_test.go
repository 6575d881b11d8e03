package lazybegin_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/idemsql/lazybegin"
)

// openDB opens the test PostgreSQL through lazybegin with one connection,
// so that every transaction and statement runs on the same session, and
// a table of the test's own.
func openDB(t *testing.T) (*sql.DB, string) {
	t.Helper()
	cfg, err := pgx.ParseConfig(testenv.URL(t, testenv.PostgresEnv, "postgres://idem:idem@127.0.0.1:5432/idem_test?sslmode=disable"))
	if err != nil {
		t.Fatal(err)
	}
	db := lazybegin.OpenDB(*cfg)
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	var b [6]byte
	_, _ = rand.Read(b[:])
	table := "lazybegin_" + hex.EncodeToString(b[:])
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `CREATE TABLE `+table+` (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := db.ExecContext(ctx, `DROP TABLE `+table); err != nil {
			t.Error(err)
		}
	})
	return db, table
}

func count(t *testing.T, db *sql.DB, table string) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(context.Background(), `SELECT count(*) FROM `+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A transaction's first Exec runs inside the transaction (BEGIN went
// first): rolled back, its row is gone; committed, it stays.
func TestFirstExecIsInTheTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, table := openDB(t)
	for _, commit := range []bool{false, true} {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		r, err := tx.ExecContext(ctx, `INSERT INTO `+table+` (id) VALUES ($1)`, "a")
		if err != nil {
			t.Fatal(err)
		}
		if n, err := r.RowsAffected(); err != nil || n != 1 {
			t.Fatalf("rows affected %d, %v; want 1", n, err)
		}
		if commit {
			err = tx.Commit()
		} else {
			err = tx.Rollback()
		}
		if err != nil {
			t.Fatal(err)
		}
		if want, n := map[bool]int{false: 0, true: 1}[commit], count(t, db, table); n != want {
			t.Fatalf("commit %v: %d rows, want %d", commit, n, want)
		}
	}
}

// A transaction whose first statement is not sent in a batch with BEGIN
// (a query; an Exec without arguments, which stdlib sends as a simple
// query that may hold several statements) begins before it: what it and
// the statements after it write is rolled back with the transaction.
func TestFirstStatementAfterBegin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, table := openDB(t)
	firsts := map[string]func(tx *sql.Tx) error{
		"a query": func(tx *sql.Tx) error {
			var one int
			return tx.QueryRowContext(ctx, `SELECT 1`).Scan(&one)
		},
		"an Exec of two statements": func(tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO `+table+` (id) VALUES ('e'); INSERT INTO `+table+` (id) VALUES ('f')`)
			return err
		},
	}
	for name, first := range firsts {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := first(tx); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+table+` (id) VALUES ($1)`, "g"); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		if n := count(t, db, table); n != 0 {
			t.Fatalf("%s first: %d rows after the rollback, want 0", name, n)
		}
	}
}

// A transaction that ran no statement ends without error, and leaves the
// session out of any transaction.
func TestEmptyTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, table := openDB(t)
	for _, commit := range []bool{true, false} {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if commit {
			err = tx.Commit()
		} else {
			err = tx.Rollback()
		}
		if err != nil {
			t.Fatalf("ending an empty transaction (commit %v): %v", commit, err)
		}
	}
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var status byte
	err = c.Raw(func(dc any) error {
		status = dc.(interface{ Conn() *pgx.Conn }).Conn().PgConn().TxStatus()
		return nil
	})
	c.Close() // the pool's one connection, for count
	if err != nil {
		t.Fatal(err)
	}
	if status != 'I' {
		t.Fatalf("session status %q after empty transactions, want 'I' (idle, no transaction)", status)
	}
	if n := count(t, db, table); n != 0 {
		t.Fatalf("%d rows, want 0", n)
	}
}

// A first statement that fails aborts the transaction it began: Commit
// reports that the server rolled it back, nothing is kept, and the
// connection serves the next transaction.
func TestFailedFirstStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, table := openDB(t)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO `+table+` (id) VALUES ($1), ($1)`, "d"); err == nil {
		t.Fatal("a duplicate key inserted")
	}
	if err := tx.Commit(); !errors.Is(err, pgx.ErrTxCommitRollback) {
		t.Fatalf("Commit of a failed transaction: %v, want %v", err, pgx.ErrTxCommitRollback)
	}
	if n := count(t, db, table); n != 0 {
		t.Fatalf("%d rows, want 0", n)
	}
}

// Options other than the default begin at once, with the level asked for.
func TestIsolationLevelBeginsAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := openDB(t)
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var level string
	if err := tx.QueryRowContext(ctx, `SHOW transaction_isolation`).Scan(&level); err != nil || level != "repeatable read" {
		t.Fatalf("isolation %q, %v; want repeatable read", level, err)
	}
}

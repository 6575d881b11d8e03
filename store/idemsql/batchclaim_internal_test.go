package idemsql

import (
	"database/sql"
	"path/filepath"
	"sync"
	"testing"

	_ "modernc.org/sqlite"
)

// TestMariaDBReturning checks which server versions get the RETURNING
// batch claim: MariaDB from 10.5 on, never MySQL.
func TestMariaDBReturning(t *testing.T) {
	for v, want := range map[string]bool{
		"10.11.19-MariaDB-0+deb12u1": true,
		"10.5.0-MariaDB":             true,
		"11.4.2-MariaDB-log":         true,
		"10.4.32-MariaDB":            false,
		"5.5.5-10.11.6-MariaDB":      false, // the old replication prefix: not parsed as 10.11
		"8.0.36":                     false,
		"8.4.0-commercial":           false,
		"":                           false,
	} {
		if got := mariaDBReturning(v); got != want {
			t.Errorf("mariaDBReturning(%q) = %v, want %v", v, got, want)
		}
	}
}

// TestCapabilityPerStore: what a Store learns of its server stays with
// that Store. Two Stores over one *sql.DB: the first made to take the
// path of an SQLite without the batch claim's statement (as
// WithoutSQLiteBatchStatement does) keeps it, while the second, asked by
// 4 goroutines at once, finds modernc.org/sqlite's statement, and all 4
// get that answer; a value once known is not replaced.
func TestCapabilityPerStore(t *testing.T) {
	ctx := t.Context()
	db, err := sql.Open("sqlite", SQLiteDSN(filepath.Join(t.TempDir(), "cap.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(4)
	without, err := New(db, SQLite, nil)
	if err != nil {
		t.Fatal(err)
	}
	with, err := New(db, SQLite, nil)
	if err != nil {
		t.Fatal(err)
	}
	without.batchStatement.set(false)
	ask := func(s *Store) (bool, error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return false, err
		}
		defer func() { _ = tx.Rollback() }()
		return s.sqliteBatchStatement(ctx, tx)
	}
	if v, err := ask(without); err != nil || v {
		t.Fatalf("the Store set without the statement: %v %v, want false", v, err)
	}
	if v, known := with.batchStatement.get(); known {
		t.Fatalf("the other Store knows %v before asking: the value leaked across Stores", v)
	}
	var wg sync.WaitGroup
	got := make([]bool, 4)
	errs := make([]error, 4)
	for i := range got {
		wg.Go(func() { got[i], errs[i] = ask(with) })
	}
	wg.Wait()
	for i := range got {
		if errs[i] != nil || !got[i] {
			t.Errorf("asker %d: %v %v, want true", i, got[i], errs[i])
		}
	}
	if v, known := with.batchStatement.get(); !known || !v {
		t.Errorf("after asking: %v known %v, want true, known", v, known)
	}
	if !with.batchStatement.set(false) {
		t.Error("set(false) replaced a known true")
	}
}

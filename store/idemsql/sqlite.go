package idemsql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"strconv"
	"strings"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/sqlstore"
)

// SQLiteBusyTimeoutMS is the busy timeout [SQLiteDSN] sets, in
// milliseconds: how long a writer waits for another connection's write
// lock before failing with SQLITE_BUSY.
const SQLiteBusyTimeoutMS = 10000

// SQLiteDSN returns the data source name that opens the SQLite database
// file at path the way the store needs it, for modernc.org/sqlite (driver
// name "sqlite"):
//
//	file:PATH?_txlock=immediate&_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)
//
// The parameters:
//
//   - _txlock=immediate makes every transaction begun with BeginTx (and not
//     read-only) start with BEGIN IMMEDIATE: it takes the write lock at once,
//     so a transaction never reads first and then fails with SQLITE_BUSY
//     when it tries to write (a deferred transaction cannot wait for the
//     lock once it has read, and in WAL mode fails at once if another
//     writer committed since its read).
//   - busy_timeout makes a writer wait up to SQLiteBusyTimeoutMS for the
//     lock instead of failing at once; modernc.org/sqlite also ends the
//     wait when the context of the call is done.
//   - journal_mode(WAL) lets readers run while one writer writes; the mode
//     is stored in the file.
//
// They were checked against modernc.org/sqlite v1.62.0 (the Driver.Open
// documentation, and newConn/applyQueryParams and tx.go in its source):
// _txlock takes deferred, immediate or exclusive and sets the BEGIN that
// BeginTx runs; each _pragma value runs as PRAGMA on every new connection,
// in order. [New] checks the outcome, not the DSN text, so any driver and
// DSN that produce the same settings are accepted.
//
// path is escaped for the file: URI form ('%', '?' and '#'), so any file
// name works. ":memory:" gives an in-memory database, which needs
// db.SetMaxOpenConns(1) since every connection opens its own; the
// journal_mode pragma reports "memory" there and is harmless.
//
// With WAL, reads do not block the one writer, but writers take turns:
// db.SetMaxOpenConns of a few connections is plenty, and more only adds
// waiting writers. The same database can hold the handlers' own tables, so
// that a side effect and its claim commit in one transaction.
func SQLiteDSN(path string) string {
	r := strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23")
	return "file:" + r.Replace(path) + "?_txlock=immediate" +
		"&_pragma=busy_timeout(" + strconv.Itoa(SQLiteBusyTimeoutMS) + ")" +
		"&_pragma=journal_mode(WAL)"
}

// SQLiteSettingError is returned by [New] for a SQLite database opened
// without a setting the store depends on. It matches idemdriver.ErrInvalidConfig
// with errors.Is. Open the database with [SQLiteDSN] to get them all.
type SQLiteSettingError struct {
	// Setting is what is wrong: "busy_timeout", "journal_mode", "_txlock"
	// or "max open connections".
	Setting string
	// Got is the value found.
	Got string
	// Want says what is needed.
	Want string
}

// Error implements error.
func (e *SQLiteSettingError) Error() string {
	return fmt.Sprintf("idemsql: SQLite %s is %s, want %s (open the database with idemsql.SQLiteDSN)", e.Setting, e.Got, e.Want)
}

// Is reports whether target is idemdriver.ErrInvalidConfig.
func (e *SQLiteSettingError) Is(target error) bool { return target == idemdriver.ErrInvalidConfig }

// checkSQLite checks db's settings and returns the scope of the in-process
// purge lock: the main database file, or the *sql.DB for an in-memory one.
func checkSQLite(ctx context.Context, db *sql.DB) (scope string, err error) {
	var timeout int64
	if err := db.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&timeout); err != nil {
		return "", fmt.Errorf("idemsql: reading PRAGMA busy_timeout: %w", err)
	}
	if timeout <= 0 {
		return "", &SQLiteSettingError{Setting: "busy_timeout", Got: strconv.FormatInt(timeout, 10),
			Want: "> 0 ms, e.g. _pragma=busy_timeout(10000) in the DSN"}
	}
	file, err := sqliteMainFile(ctx, db)
	if err != nil {
		return "", err
	}
	maxOpen := db.Stats().MaxOpenConnections
	if file == "" {
		if maxOpen != 1 {
			return "", &SQLiteSettingError{Setting: "max open connections", Got: maxOpenString(maxOpen),
				Want: "1 for an in-memory database, whose every connection opens a database of its own (db.SetMaxOpenConns(1))"}
		}
		return fmt.Sprintf("memory:%p", db), nil
	}
	var mode string
	if err := db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		return "", fmt.Errorf("idemsql: reading PRAGMA journal_mode: %w", err)
	}
	if !strings.EqualFold(mode, "wal") {
		return "", &SQLiteSettingError{Setting: "journal_mode", Got: mode, Want: "wal, e.g. _pragma=journal_mode(WAL) in the DSN"}
	}
	if maxOpen != 1 { // with one connection there is no second one to probe from
		immediate, err := probeImmediate(ctx, db)
		if err != nil {
			return "", fmt.Errorf("idemsql: checking the SQLite transaction mode: %w", err)
		}
		if !immediate {
			return "", &SQLiteSettingError{Setting: "_txlock", Got: "deferred (transactions start without the write lock)",
				Want: "immediate, e.g. _txlock=immediate in the DSN"}
		}
	}
	return "file:" + file, nil
}

func maxOpenString(n int) string {
	if n <= 0 {
		return "unlimited"
	}
	return strconv.Itoa(n)
}

// sqliteMainFile returns the file of the main database, "" when it is in
// memory (or a temporary database).
func sqliteMainFile(ctx context.Context, db *sql.DB) (string, error) {
	rows, err := db.QueryContext(ctx, "PRAGMA database_list")
	if err != nil {
		return "", fmt.Errorf("idemsql: reading PRAGMA database_list: %w", err)
	}
	defer rows.Close()
	var file string
	for rows.Next() {
		var (
			seq        int64
			name, path sql.NullString
		)
		if err := rows.Scan(&seq, &name, &path); err != nil {
			return "", fmt.Errorf("idemsql: reading PRAGMA database_list: %w", err)
		}
		if name.String == "main" {
			file = path.String
		}
	}
	return file, rows.Err()
}

// probeImmediate reports whether transactions begun on db take SQLite's
// write lock at once (BEGIN IMMEDIATE or EXCLUSIVE): it begins one on a
// connection and, from a second connection with no busy timeout, tries to
// take the write lock. The second connection's busy timeout is restored
// afterwards; a connection left in an unknown state is closed, not pooled.
func probeImmediate(ctx context.Context, db *sql.DB) (bool, error) {
	holder, err := db.Conn(ctx)
	if err != nil {
		return false, err
	}
	defer holder.Close()
	tx, err := holder.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()

	prober, err := db.Conn(ctx)
	if err != nil {
		return false, err
	}
	defer prober.Close()
	var timeout int64
	if err := prober.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&timeout); err != nil {
		return false, err
	}
	if _, err := prober.ExecContext(ctx, "PRAGMA busy_timeout = 0"); err != nil {
		return false, err
	}
	defer func() {
		rctx, cancel := sqlstore.Detached(ctx)
		defer cancel()
		if _, err := prober.ExecContext(rctx, "PRAGMA busy_timeout = "+strconv.FormatInt(timeout, 10)); err != nil {
			discard(prober)
		}
	}()
	if _, err := prober.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		// The write lock is held: the holder's BEGIN took it.
		return true, nil
	}
	rctx, cancel := sqlstore.Detached(ctx)
	defer cancel()
	if _, err := prober.ExecContext(rctx, "ROLLBACK"); err != nil {
		discard(prober)
	}
	return false, nil
}

// discard closes c's driver connection instead of returning it to the pool.
func discard(c *sql.Conn) {
	_ = c.Raw(func(any) error { return driver.ErrBadConn })
}

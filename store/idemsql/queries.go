package idemsql

import (
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem/internal/sqlstore"
)

// queries holds the MySQL or SQLite statements of one Store, with its
// table name filled in once (PostgreSQL's are internal/pgsql's, shared
// with store/idempgxv5). Statements whose length depends on a batch size
// are built from the parts named *Prefix, *Row and *Suffix.
//
// Times cross the driver as int64 microseconds since the Unix epoch (UTC),
// converted by the server, so nothing depends on a driver's time handling
// (go-sql-driver's parseTime, a session time zone).
type queries struct {
	// claim inserts one record: consumer, message ID, fingerprint.
	claim string
	// fingerprint reads one record's fingerprint and state: consumer,
	// message ID.
	fingerprint string

	// MySQL and SQLite multi-row statements (see mysqlClaimSQL and
	// Store.batchText).
	batchPrefix          string
	fpsPrefix, fpsSuffix string

	// runs are the retention statements (the purge batches are in
	// leaseQueries).
	runs sqlstore.RunQueries
	// inspect: consumer, message ID -> fingerprint, processed at (µs),
	// state, token, attempt, lease expiry (µs, NULL when none), last
	// error, result, content type.
	inspect string
	// stats -> consumer, count, oldest (µs), newest (µs).
	stats string
	// migrations is the migrations table.
	migrations sqlstore.MigrationTable
}

// MySQL times: processed_at is a UTC DATETIME(6); these convert it to and
// from microseconds without the session time zone (unlike UNIX_TIMESTAMP).
const mysqlEpoch = `CAST('1970-01-01 00:00:00' AS DATETIME(6))`

func mysqlMicros(x string) string { return `TIMESTAMPDIFF(MICROSECOND, ` + mysqlEpoch + `, ` + x + `)` }

const mysqlTimeParam = `(` + mysqlEpoch + ` + INTERVAL ? MICROSECOND)`

// MySQL claims are one INSERT ... ON DUPLICATE KEY UPDATE of up to 64 rows
// whose update clause, which runs only for a row that already exists (after
// waiting for the transaction inserting it, if any), leaves the row as it is
// and sets bit i of LAST_INSERT_ID for the i-th row of the statement
// (FIELD finds i from the row's message_id). The first row's processed_at
// expression resets LAST_INSERT_ID to 0 before any row is written. The
// server reports the final value to the client as the statement's insert
// ID (the table has no AUTO_INCREMENT column), so the insert ID is a bitmask
// of the duplicates, exact per row and independent of rows affected, which
// CLIENT_FOUND_ROWS changes.
const (
	mysqlFirstRow  = `(?, ?, ?, IF(LAST_INSERT_ID(0) = 0, UTC_TIMESTAMP(6), NULL))`
	mysqlRow       = `(?, ?, ?, UTC_TIMESTAMP(6))`
	mysqlDupPrefix = ` ON DUPLICATE KEY UPDATE consumer = IF(LAST_INSERT_ID(LAST_INSERT_ID() | (1 << (FIELD(message_id, `
	mysqlDupSuffix = `) - 1))) >= 0, consumer, consumer)`
)

// mysqlClaimSQL returns the MySQL claim statement for n rows (1 to 64),
// whose arguments are the (consumer, message ID, fingerprint) of each row,
// then the n message IDs again.
func mysqlClaimSQL(prefix string, n int) string {
	var b strings.Builder
	b.WriteString(prefix)
	b.WriteString(mysqlFirstRow)
	for range n - 1 {
		b.WriteString(", ")
		b.WriteString(mysqlRow)
	}
	b.WriteString(mysqlDupPrefix)
	b.WriteString(strings.TrimSuffix(strings.Repeat("?, ", n), ", "))
	b.WriteString(mysqlDupSuffix)
	return b.String()
}

// mysqlLockTimeout returns the prefix that gives a MySQL claim statement
// its own lock timeout d, rounded up to whole seconds (InnoDB's unit), or
// "" when d is not positive. It is MariaDB's SET STATEMENT
// innodb_lock_wait_timeout=N FOR, in a MariaDB executable comment
// (/*M!...*/) that MariaDB 10.3.1 and later run and MySQL reads as a
// comment: MySQL claims wait up to the session's innodb_lock_wait_timeout
// (50s unless the DSN sets it). The setting lasts for the one statement,
// so the handler's statements keep the session's. A wait past it is error
// 1205 (ER_LOCK_WAIT_TIMEOUT), which rolls back that statement only.
func mysqlLockTimeout(d time.Duration) string {
	if d <= 0 {
		return ""
	}
	return `/*M!100301 SET STATEMENT innodb_lock_wait_timeout=` + strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10) + ` FOR */ `
}

func mysqlQueries(t string) queries {
	batchPrefix := `INSERT INTO ` + t + ` (consumer, message_id, fingerprint, processed_at) VALUES `
	runs := t + `_runs`
	return queries{
		claim: mysqlClaimSQL(batchPrefix, 1),
		// A locking read: under REPEATABLE READ a plain SELECT reads the
		// transaction's snapshot, which may predate the record a concurrent
		// transaction committed while our insert waited for it. The
		// records exist (the claim holds their row locks), so point
		// lookups on the primary key lock those rows and no gaps. FORCE
		// INDEX keeps the optimizer from scanning the consumer's range
		// instead, which would lock, and wait for, rows other transactions
		// are inserting (a deadlock with them).
		fingerprint: `SELECT fingerprint, state FROM ` + t + ` FORCE INDEX (PRIMARY) WHERE consumer = ? AND message_id = ? LOCK IN SHARE MODE`,
		batchPrefix: batchPrefix,
		fpsPrefix:   `SELECT message_id, fingerprint, state FROM ` + t + ` FORCE INDEX (PRIMARY) WHERE consumer = ? AND message_id IN (`,
		fpsSuffix:   `) LOCK IN SHARE MODE`,
		// Runs: a plain read of the newest run, then an UPDATE of that row
		// by primary key (no locking read that could take gap locks), then,
		// unless it extended the run, an INSERT. rows affected is 0 when
		// the end was already now (without CLIENT_FOUND_ROWS): the INSERT
		// then adds an empty run, which adds no running time.
		runs: sqlstore.RunQueries{
			Newest: `SELECT ` + mysqlMicros(`started_at`) + `, ` + mysqlMicros(`ended_at`) + `, ` + mysqlMicros(`UTC_TIMESTAMP(6)`) + `
FROM ` + runs + ` WHERE consumer = ? ORDER BY started_at DESC LIMIT 1`,
			Extend: `UPDATE ` + runs + ` SET ended_at = GREATEST(ended_at, UTC_TIMESTAMP(6))
WHERE consumer = ? AND started_at = ` + mysqlTimeParam + ` AND ended_at >= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND`,
			Insert: `INSERT INTO ` + runs + ` (consumer, started_at, ended_at) VALUES (?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE ended_at = GREATEST(ended_at, UTC_TIMESTAMP(6))`,
			Runs:  `SELECT ` + mysqlMicros(`started_at`) + `, ` + mysqlMicros(`ended_at`) + ` FROM ` + runs + ` WHERE consumer = ? ORDER BY started_at`,
			Count: `SELECT COUNT(*) FROM ` + t + ` WHERE consumer = ? AND processed_at < ` + mysqlTimeParam + ` AND ` + mysqlNotInProgress,
			Prune: `DELETE FROM ` + runs + ` WHERE consumer = ? AND ended_at < ` + mysqlTimeParam,
		},
		inspect: `SELECT fingerprint, ` + mysqlMicros(`processed_at`) + `, ` + leaseCols + `, ` + mysqlMicros(`lease_expires_at`) + `, last_error, result, content_type
FROM ` + t + ` WHERE consumer = ? AND message_id = ?`,
		stats: `SELECT consumer, COUNT(*), ` + mysqlMicros(`MIN(processed_at)`) + `, ` + mysqlMicros(`MAX(processed_at)`) +
			` FROM ` + t + ` GROUP BY consumer ORDER BY consumer`,
		migrations: sqlstore.MigrationTable{
			Name: t + `_migrations`,
			Create: `CREATE TABLE IF NOT EXISTS ` + t + `_migrations (
    version    INT NOT NULL PRIMARY KEY,
    applied_at DATETIME(6) NOT NULL
) ENGINE=InnoDB`,
			Record: `INSERT INTO ` + t + `_migrations (version, applied_at) VALUES (?, UTC_TIMESTAMP(6))`,
		},
	}
}

// sqliteNow is SQLite's clock in Unix microseconds. SQLite keeps 'now' in
// milliseconds (stable within one statement), so the value is a whole
// number of milliseconds times 1000. julianday works on every SQLite
// version; ROUND undoes the float's error (well under a millisecond).
const sqliteNow = `(CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)`

func sqliteQueries(t string) queries {
	runs := t + `_runs`
	return queries{
		// ON CONFLICT DO NOTHING, not INSERT OR IGNORE, which would also
		// swallow NOT NULL and CHECK violations. The claim and its read,
		// which run per message, take anonymous ? placeholders:
		// modernc.org/sqlite reads a numbered one's name (?1) into a Go
		// string at every bind, an allocation per argument.
		claim: `INSERT INTO ` + t + ` (consumer, message_id, fingerprint, processed_at) VALUES (?, ?, ?, ` + sqliteNow + `)
	ON CONFLICT (consumer, message_id) DO NOTHING`,
		fingerprint: `SELECT fingerprint, state FROM ` + t + ` WHERE consumer = ? AND message_id = ?`,
		batchPrefix: `INSERT INTO ` + t + ` (consumer, message_id, fingerprint, processed_at) VALUES `,
		fpsPrefix:   `SELECT message_id, fingerprint, state FROM ` + t + ` WHERE consumer = ? AND message_id IN (`,
		fpsSuffix:   `)`,
		// Runs, as on MySQL: a read of the newest run, an UPDATE of it,
		// and an INSERT unless it extended the run.
		runs: sqlstore.RunQueries{
			Newest: `SELECT started_at, ended_at, ` + sqliteNow + ` FROM ` + runs + ` WHERE consumer = ?1 ORDER BY started_at DESC LIMIT 1`,
			Extend: `UPDATE ` + runs + ` SET ended_at = MAX(ended_at, ` + sqliteNow + `)
WHERE consumer = ?1 AND started_at = ?2 AND ended_at >= ` + sqliteNow + ` - ?3`,
			Insert: `INSERT INTO ` + runs + ` (consumer, started_at, ended_at) VALUES (?1, ` + sqliteNow + `, ` + sqliteNow + `)
ON CONFLICT (consumer, started_at) DO UPDATE SET ended_at = MAX(ended_at, excluded.ended_at)`,
			Runs:  `SELECT started_at, ended_at FROM ` + runs + ` WHERE consumer = ?1 ORDER BY started_at`,
			Count: `SELECT COUNT(*) FROM ` + t + ` WHERE consumer = ?1 AND processed_at < ?2 AND state <> 1`,
			Prune: `DELETE FROM ` + runs + ` WHERE consumer = ?1 AND ended_at < ?2`,
		},
		inspect: `SELECT fingerprint, processed_at, state, token, attempt, lease_expires_at, last_error, result, content_type
FROM ` + t + ` WHERE consumer = ?1 AND message_id = ?2`,
		stats: `SELECT consumer, COUNT(*), MIN(processed_at), MAX(processed_at) FROM ` + t + ` GROUP BY consumer ORDER BY consumer`,
		migrations: sqlstore.MigrationTable{
			Name: t + `_migrations`,
			Create: `CREATE TABLE IF NOT EXISTS ` + t + `_migrations (
    version    INTEGER PRIMARY KEY,
    applied_at INTEGER NOT NULL
)`,
			Record: `INSERT INTO ` + t + `_migrations (version, applied_at) VALUES (?1, ` + sqliteNow + `)`,
		},
	}
}

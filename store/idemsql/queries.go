package idemsql

import (
	"strconv"
	"strings"
)

// queries holds the statements of one Store, with its table name filled in
// once. Statements whose length depends on a batch size are built from the
// parts named *Prefix, *Row and *Suffix.
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

	// PostgreSQL batch claim: consumer, text[] of IDs, text[] of hex
	// fingerprints -> message ID, fingerprint, state.
	claimBatch string
	// PostgreSQL fingerprints and states: consumer, text[] of IDs.
	fingerprints string

	// MySQL and SQLite multi-row statements (batchRow and batchSuffix:
	// SQLite only; see mysqlClaimSQL).
	batchPrefix, batchRow, batchSuffix string
	fpsPrefix, fpsSuffix               string

	// newest: the consumer's newest record time minus a window: window
	// (µs), consumer. NULL when the consumer has no records.
	horizon string
	// purgeCount: consumer, horizon (µs): the records a purge would
	// delete (not in_progress). The batches are in leaseQueries.
	purgeCount string
	// inspect: consumer, message ID -> fingerprint, processed at (µs),
	// state, token, attempt, lease expiry (µs, NULL when none), last error.
	inspect string
	// stats -> consumer, count, oldest (µs), newest (µs).
	stats string
	// migTable is the migrations table.
	migTable string
}

// pgMicros is a timestamptz as int64 microseconds since the epoch: exact on
// PostgreSQL 14 and later, where extract returns numeric.
func pgMicros(x string) string {
	return `(extract(epoch from ` + x + `) * 1000000)::bigint`
}

// pgTime is the timestamptz of a $n parameter holding microseconds.
func pgTime(param string) string {
	return `('epoch'::timestamptz + ` + param + `::bigint * interval '1 microsecond')`
}

func postgresQueries(t string) queries {
	return queries{
		// One statement claims and, on a conflict with a record committed
		// before it began, reads the stored fingerprint and state (a
		// lease-mode record may be in progress or failed): the outer SELECT
		// sees the statement's snapshot, which holds neither this
		// statement's insert nor a record committed by a concurrent
		// transaction the insert waited for. In that last case (not
		// inserted, NULL fingerprint) a new statement, with a new READ
		// COMMITTED snapshot, reads it.
		claim: `WITH ins AS (
	INSERT INTO ` + t + ` (consumer, message_id, fingerprint)
	VALUES ($1::text, $2::text, $3::bytea)
	ON CONFLICT (consumer, message_id) DO NOTHING
	RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM ins), r.fingerprint, r.state
FROM (SELECT 1) AS one
LEFT JOIN ` + t + ` AS r ON r.consumer = $1::text AND r.message_id = $2::text`,
		fingerprint: `SELECT fingerprint, state FROM ` + t + ` WHERE consumer = $1::text AND message_id = $2::text`,
		// The batch version: rows with a NULL fingerprint were inserted by
		// this statement, the others are records committed before it began.
		// IDs in neither were committed by transactions it waited for.
		claimBatch: `WITH ins AS (
	INSERT INTO ` + t + ` (consumer, message_id, fingerprint)
	SELECT $1::text, u.id, decode(u.fp, 'hex') FROM unnest($2::text[], $3::text[]) AS u(id, fp)
	ON CONFLICT (consumer, message_id) DO NOTHING
	RETURNING message_id
)
SELECT message_id, NULL::bytea, NULL::smallint FROM ins
UNION ALL
SELECT message_id, fingerprint, state FROM ` + t + ` WHERE consumer = $1::text AND message_id = ANY ($2::text[])`,
		fingerprints: `SELECT message_id, fingerprint, state FROM ` + t + ` WHERE consumer = $1::text AND message_id = ANY ($2::text[])`,
		horizon:      `SELECT ` + pgMicros(`max(processed_at)`) + ` - $1::bigint FROM ` + t + ` WHERE consumer = $2::text`,
		purgeCount:   `SELECT count(*) FROM ` + t + ` WHERE consumer = $1::text AND processed_at < ` + pgTime(`$2`) + ` AND state <> 1`,
		inspect: `SELECT fingerprint, ` + pgMicros(`processed_at`) + `, state, token, attempt, ` + pgMicros(`lease_expires_at`) + `, last_error
FROM ` + t + ` WHERE consumer = $1::text AND message_id = $2::text`,
		stats: `SELECT consumer, count(*), ` + pgMicros(`min(processed_at)`) + `, ` + pgMicros(`max(processed_at)`) +
			` FROM ` + t + ` GROUP BY consumer ORDER BY consumer`,
		migTable: t + `_migrations`,
	}
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

func mysqlQueries(t string) queries {
	batchPrefix := `INSERT INTO ` + t + ` (consumer, message_id, fingerprint, processed_at) VALUES `
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
		horizon:     `SELECT ` + mysqlMicros(`MAX(processed_at)`) + ` - ? FROM ` + t + ` WHERE consumer = ?`,
		purgeCount:  `SELECT COUNT(*) FROM ` + t + ` WHERE consumer = ? AND processed_at < ` + mysqlTimeParam + ` AND state <> 1`,
		inspect: `SELECT fingerprint, ` + mysqlMicros(`processed_at`) + `, state, token, attempt, ` + mysqlMicros(`lease_expires_at`) + `, last_error
FROM ` + t + ` WHERE consumer = ? AND message_id = ?`,
		stats: `SELECT consumer, COUNT(*), ` + mysqlMicros(`MIN(processed_at)`) + `, ` + mysqlMicros(`MAX(processed_at)`) +
			` FROM ` + t + ` GROUP BY consumer ORDER BY consumer`,
		migTable: t + `_migrations`,
	}
}

// sqliteNow is SQLite's clock in Unix microseconds. SQLite keeps 'now' in
// milliseconds (stable within one statement), so the value is a whole
// number of milliseconds times 1000. julianday works on every SQLite
// version; ROUND undoes the float's error (well under a millisecond).
const sqliteNow = `(CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)`

func sqliteQueries(t string) queries {
	return queries{
		// ON CONFLICT DO NOTHING, not INSERT OR IGNORE, which would also
		// swallow NOT NULL and CHECK violations.
		claim: `INSERT INTO ` + t + ` (consumer, message_id, fingerprint, processed_at) VALUES (?1, ?2, ?3, ` + sqliteNow + `)
	ON CONFLICT (consumer, message_id) DO NOTHING`,
		fingerprint: `SELECT fingerprint, state FROM ` + t + ` WHERE consumer = ?1 AND message_id = ?2`,
		batchPrefix: `INSERT INTO ` + t + ` (consumer, message_id, fingerprint, processed_at) VALUES `,
		batchRow:    `(?1, ?%d, ?%d, ` + sqliteNow + `)`,
		batchSuffix: ` ON CONFLICT (consumer, message_id) DO NOTHING RETURNING message_id`,
		fpsPrefix:   `SELECT message_id, fingerprint, state FROM ` + t + ` WHERE consumer = ?1 AND message_id IN (`,
		fpsSuffix:   `)`,
		horizon:     `SELECT MAX(processed_at) - ?1 FROM ` + t + ` WHERE consumer = ?2`,
		purgeCount:  `SELECT COUNT(*) FROM ` + t + ` WHERE consumer = ?1 AND processed_at < ?2 AND state <> 1`,
		inspect: `SELECT fingerprint, processed_at, state, token, attempt, lease_expires_at, last_error
FROM ` + t + ` WHERE consumer = ?1 AND message_id = ?2`,
		stats:    `SELECT consumer, COUNT(*), MIN(processed_at), MAX(processed_at) FROM ` + t + ` GROUP BY consumer ORDER BY consumer`,
		migTable: t + `_migrations`,
	}
}

// pgTextArray renders ss as a PostgreSQL array literal ('{"a","b"}'), sent
// as an ordinary string parameter and cast with ::text[] in SQL, so the
// store works with any driver, not only one that maps []string to arrays.
// Every element is quoted, so none is read as NULL or loses spaces.
func pgTextArray(ss []string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, s := range ss {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		for j := 0; j < len(s); j++ {
			if c := s[j]; c == '"' || c == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(s[j])
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

// sqliteRow is the i-th (from 0) row of a SQLite batch insert: parameters
// ?1 (the consumer), then two per row.
func sqliteRow(row string, i int) string {
	r := strings.Replace(row, "%d", strconv.Itoa(2*i+2), 1)
	return strings.Replace(r, "%d", strconv.Itoa(2*i+3), 1)
}

package idemsql

// leaseQueries holds the MySQL or SQLite lease-mode statements of one
// Store (see lease.go), with its table names filled in once (PostgreSQL's
// are internal/pgsql's). Lease durations and remaining
// leases cross the driver as int64 microseconds; every time is computed by
// the server.
//
// Every statement that reads a record for Acquire returns the columns of
// recordCols, in the order of sqlstore.LeaseRecord: state, token, attempt,
// fingerprint, the remaining lease in microseconds (0 unless in_progress
// with a live lease), result, content type, last error, and whether the
// record could be taken over by the caller now (in_progress, lease ended,
// same fingerprint).
//
// The remaining lease is the expiry minus the later of now and updated_at,
// the time of the write that set the expiry (now plus the lease): never
// more than the lease granted. A read's now can be earlier than that
// write's and yet see it: MySQL's UTC_TIMESTAMP is its statement's start,
// before its read view (and any lock wait).
type leaseQueries struct {
	// acquire: SQLite: consumer, message ID, fingerprint, lease (µs).
	// MySQL: the INSERT of a new record only, with the same arguments.
	acquire string
	// record reads recordCols: consumer, message ID, fingerprint.
	record string
	// lock (MySQL) locks a record: consumer, message ID. lockRecord is
	// record with FOR UPDATE.
	lock, lockRecord string
	// takeover (MySQL): lease (µs), consumer, message ID.
	takeover string
	// steps: consumer, message ID -> step, result.
	steps string
	// renew: lease (µs), consumer, message ID, token.
	renew string
	// complete: result, content type, consumer, message ID, token.
	complete string
	// release: error text, terminal (0 or 1), consumer, message ID, token.
	release string
	// ownStep (MySQL): consumer, message ID, token -> a row when owned,
	// locked in share mode. saveStep: SQLite: consumer, message ID,
	// token, step, result, judged by rows affected; MySQL: consumer,
	// message ID, step, result, inside the transaction that ran ownStep.
	ownStep, saveStep string
	// point: consumer, message ID, step -> the recovery point saved with
	// an empty result (kept when it exists), inside the transaction of
	// an Acquire or a Release that holds the record.
	point string
	// acquireMany (SQLite): acquire for a batch in one statement: a JSON
	// array of [consumer, message ID, fingerprint in hex, lease (µs)]
	// -> consumer, message ID, token, attempt of each one acquired.
	// pointMany (SQLite): point for a batch: a JSON array of [consumer,
	// message ID, step].
	acquireMany, pointMany string

	// purgeBatch: MySQL: the locking SELECT of a batch: consumer,
	// horizon (µs), batch size -> message ID, token. SQLite: DELETE ...
	// RETURNING message ID, token.
	purgeBatch string
	// purgeSteps (MySQL, SQLite): the DELETE of steps, completed with an
	// IN list of message IDs: consumer, IDs...
	purgeSteps string
	// purgeRecords (MySQL): the DELETE of records, completed with an IN
	// list: consumer, IDs...
	purgeRecords string
}

// leaseCols reads a record's state, token and attempt. Since MySQL's
// migration 006 a transactional record holds them as NULL, read as the
// values of one: completed (2), token 0, attempt 1. SQLite's columns are
// NOT NULL with those defaults, which the same expressions read as they
// are.
const leaseCols = `COALESCE(state, 2), COALESCE(token, 0), COALESCE(attempt, 1)`

// mysqlNotInProgress selects the records a purge may delete: every one
// but the in_progress ones, a NULL state (a transactional record) among
// them, which "state <> 1" would skip.
const mysqlNotInProgress = `COALESCE(state, 2) <> 1`

// recordCols is the list of columns every record read returns, with the
// dialect's expressions for now and for the remaining lease filled in.
func recordCols(remaining, expired string) string {
	return leaseCols + `, fingerprint, ` + remaining + `, result, content_type, last_error, ` + expired
}

// mysqlNewerUpdatedAt is the updated_at of every fenced MySQL UPDATE: the
// server's time, but always later than the value it replaces, so the
// UPDATE changes the row and rows affected is 1 on success whatever
// CLIENT_FOUND_ROWS says (without it MySQL counts only changed rows).
const mysqlNewerUpdatedAt = `updated_at = GREATEST(UTC_TIMESTAMP(6), COALESCE(updated_at, UTC_TIMESTAMP(6)) + INTERVAL 1 MICROSECOND)`

func mysqlLeaseQueries(t string) leaseQueries {
	steps := t + `_steps`
	remaining := `CASE WHEN state = 1 AND lease_expires_at > UTC_TIMESTAMP(6)
	THEN TIMESTAMPDIFF(MICROSECOND, GREATEST(UTC_TIMESTAMP(6), COALESCE(updated_at, UTC_TIMESTAMP(6))), lease_expires_at) ELSE 0 END`
	expired := `COALESCE(state = 1 AND lease_expires_at <= UTC_TIMESTAMP(6) AND fingerprint = ?, 0)`
	cols := recordCols(remaining, expired)
	// The fingerprint placeholder comes first in cols; arguments are
	// fingerprint, consumer, message ID.
	pk := `consumer = ? AND message_id = ?`
	return leaseQueries{
		// The claim's duplicate detection (mysqlFirstRow): the insert ID is
		// 1 when the record existed, 0 when this statement inserted it,
		// whatever rows affected says.
		acquire: `INSERT INTO ` + t + ` (consumer, message_id, fingerprint, processed_at, state, token, attempt, lease_expires_at, updated_at)
VALUES (?, ?, ?, IF(LAST_INSERT_ID(0) = 0, UTC_TIMESTAMP(6), NULL), 1, 1, 1, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE consumer = IF(LAST_INSERT_ID(1) >= 0, consumer, consumer)`,
		record:     `SELECT ` + cols + ` FROM ` + t + ` WHERE ` + pk,
		lock:       `SELECT 1 FROM ` + t + ` WHERE ` + pk + ` FOR UPDATE`,
		lockRecord: `SELECT ` + cols + ` FROM ` + t + ` WHERE ` + pk + ` FOR UPDATE`,
		takeover: `UPDATE ` + t + ` SET token = token + 1, attempt = attempt + 1,
	lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, processed_at = UTC_TIMESTAMP(6), ` + mysqlNewerUpdatedAt + `
WHERE ` + pk,
		steps: `SELECT step, result FROM ` + steps + ` WHERE ` + pk,
		renew: `UPDATE ` + t + ` SET lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, ` + mysqlNewerUpdatedAt + `
WHERE ` + pk + ` AND state = 1 AND token = ?`,
		complete: `UPDATE ` + t + ` SET state = 2, result = ?, content_type = ?,
	lease_expires_at = UTC_TIMESTAMP(6), processed_at = UTC_TIMESTAMP(6), ` + mysqlNewerUpdatedAt + `
WHERE ` + pk + ` AND state = 1 AND token = ?`,
		release: `UPDATE ` + t + ` SET last_error = ?, state = IF(? = 1, 3, 1), token = token + 1,
	lease_expires_at = UTC_TIMESTAMP(6), processed_at = UTC_TIMESTAMP(6), ` + mysqlNewerUpdatedAt + `
WHERE ` + pk + ` AND state = 1 AND token = ?`,
		// A locking read: it waits for a takeover, Complete or Release in
		// flight and sees its result under any isolation level (a plain
		// read under READ COMMITTED or REPEATABLE READ could see an older
		// owner), and holds the row in share mode until the step is saved.
		ownStep:  `SELECT 1 FROM ` + t + ` WHERE ` + pk + ` AND state = 1 AND token = ? LOCK IN SHARE MODE`,
		saveStep: `INSERT INTO ` + steps + ` (consumer, message_id, step, result, created_at) VALUES (?, ?, ?, ?, UTC_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE step = step`,
		point:    `INSERT INTO ` + steps + ` (consumer, message_id, step, result, created_at) VALUES (?, ?, ?, X'', UTC_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE step = step`,
		purgeBatch: `SELECT message_id, COALESCE(token, 0) FROM ` + t + `
WHERE consumer = ? AND processed_at < ` + mysqlTimeParam + ` AND ` + mysqlNotInProgress + `
ORDER BY processed_at LIMIT ? FOR UPDATE`,
		purgeSteps:   `DELETE FROM ` + steps + ` WHERE consumer = ? AND message_id IN (`,
		purgeRecords: `DELETE FROM ` + t + ` WHERE consumer = ? AND message_id IN (`,
	}
}

func sqliteLeaseQueries(t string) leaseQueries {
	steps := t + `_steps`
	remaining := `CASE WHEN state = 1 AND lease_expires_at > ` + sqliteNow + ` THEN lease_expires_at - MAX(` + sqliteNow + `, COALESCE(updated_at, 0)) ELSE 0 END`
	expired := `COALESCE(state = 1 AND lease_expires_at <= ` + sqliteNow + ` AND fingerprint = ?3, 0)`
	cols := recordCols(remaining, expired)
	pk := `consumer = ?1 AND message_id = ?2`
	return leaseQueries{
		// Inside a BEGIN IMMEDIATE transaction: an insert, or a takeover
		// when the DO UPDATE's WHERE holds; SQLite's 'now' is the same
		// throughout one statement.
		acquire: `INSERT INTO ` + t + ` (consumer, message_id, fingerprint, processed_at, state, token, attempt, lease_expires_at, updated_at)
VALUES (?1, ?2, ?3, ` + sqliteNow + `, 1, 1, 1, ` + sqliteNow + ` + ?4, ` + sqliteNow + `)
ON CONFLICT (consumer, message_id) DO UPDATE
SET token = token + 1, attempt = attempt + 1, lease_expires_at = excluded.lease_expires_at,
	processed_at = excluded.processed_at, updated_at = excluded.updated_at
WHERE state = 1 AND lease_expires_at <= excluded.processed_at AND fingerprint = excluded.fingerprint
RETURNING token, attempt`,
		record: `SELECT ` + cols + ` FROM ` + t + ` WHERE ` + pk,
		steps:  `SELECT step, result FROM ` + steps + ` WHERE ` + pk,
		renew: `UPDATE ` + t + ` SET lease_expires_at = ` + sqliteNow + ` + ?1, updated_at = ` + sqliteNow + `
WHERE consumer = ?2 AND message_id = ?3 AND state = 1 AND token = ?4`,
		complete: `UPDATE ` + t + ` SET state = 2, result = ?1, content_type = ?2,
	lease_expires_at = ` + sqliteNow + `, processed_at = ` + sqliteNow + `, updated_at = ` + sqliteNow + `
WHERE consumer = ?3 AND message_id = ?4 AND state = 1 AND token = ?5`,
		release: `UPDATE ` + t + ` SET last_error = ?1, state = CASE WHEN ?2 = 1 THEN 3 ELSE 1 END, token = token + 1,
	lease_expires_at = ` + sqliteNow + `, processed_at = ` + sqliteNow + `, updated_at = ` + sqliteNow + `
WHERE consumer = ?3 AND message_id = ?4 AND state = 1 AND token = ?5`,
		// One statement (SQLite runs one writer at a time): it inserts the
		// step only if the token owns the record; an existing step is kept
		// and still counts as one row changed, so rows affected is 1 exactly
		// when the token owns the record.
		saveStep: `INSERT INTO ` + steps + ` (consumer, message_id, step, result, created_at)
SELECT ?1, ?2, ?4, ?5, ` + sqliteNow + ` FROM ` + t + ` WHERE ` + pk + ` AND state = 1 AND token = ?3
ON CONFLICT (consumer, message_id, step) DO UPDATE SET created_at = created_at`,
		point: `INSERT INTO ` + steps + ` (consumer, message_id, step, result, created_at) VALUES (?1, ?2, ?3, X'', ` + sqliteNow + `)
ON CONFLICT (consumer, message_id, step) DO NOTHING`,
		// The batch's acquire: its elements' rows (json_each; WHERE true
		// tells SQLite's parser the ON CONFLICT is the upsert's), each
		// judged as acquire judges one.
		acquireMany: `INSERT INTO ` + t + ` (consumer, message_id, fingerprint, processed_at, state, token, attempt, lease_expires_at, updated_at)
SELECT j.value ->> 0, j.value ->> 1, unhex(j.value ->> 2), ` + sqliteNow + `, 1, 1, 1, ` + sqliteNow + ` + (j.value ->> 3), ` + sqliteNow + `
FROM json_each(?1) AS j WHERE true
ON CONFLICT (consumer, message_id) DO UPDATE
SET token = token + 1, attempt = attempt + 1, lease_expires_at = excluded.lease_expires_at,
	processed_at = excluded.processed_at, updated_at = excluded.updated_at
WHERE state = 1 AND lease_expires_at <= excluded.processed_at AND fingerprint = excluded.fingerprint
RETURNING consumer, message_id, token, attempt`,
		pointMany: `INSERT INTO ` + steps + ` (consumer, message_id, step, result, created_at)
SELECT j.value ->> 0, j.value ->> 1, j.value ->> 2, X'', ` + sqliteNow + ` FROM json_each(?1) AS j WHERE true
ON CONFLICT (consumer, message_id, step) DO NOTHING`,
		purgeBatch: `DELETE FROM ` + t + ` WHERE rowid IN (
	SELECT rowid FROM ` + t + ` WHERE consumer = ?1 AND processed_at < ?2 AND state <> 1 ORDER BY processed_at LIMIT ?3)
RETURNING message_id, token`,
		purgeSteps: `DELETE FROM ` + steps + ` WHERE consumer = ?1 AND message_id IN (`,
	}
}

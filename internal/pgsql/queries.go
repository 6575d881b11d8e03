// Package pgsql is the PostgreSQL that idem's stores run: every statement
// text, and the logic that runs them through an sqlstore.Querier. Both
// store/idempgxv5 (pgx) and store/idemsql's PostgreSQL dialect
// (database/sql) use it, so the two behave the same on one table, down to
// the statement text. It is internal: not part of idem's API.
//
// Parameters are the same Go values for every driver: text as string,
// bytea as []byte, bigint as int64, boolean as bool; arrays as PostgreSQL
// array literals in a string (TextArray), cast in SQL, so that no driver
// needs an array type; times and durations as int64 microseconds since
// the Unix epoch (results too), so that no driver's time handling plays a
// part.
//
// # Clocks
//
// Every time written is the server's now(): the time the statement's
// transaction began, the same for every row and column a statement writes,
// so a record's lease_expires_at minus the time its lease was set (its
// updated_at after a renewal, which alone sets it, else its processed_at)
// is exactly the lease granted. A claim inside a long
// transaction stamps processed_at with the transaction's start, which only
// makes the record look older than its commit by the transaction's length.
//
// The remaining lease an Acquire reports is the one read that is not
// now(): it is counted from GREATEST(clock_timestamp(), updated_at,
// processed_at).
// now() would be wrong twice over: it is read before the statement's
// snapshot, so a takeover or renewal that committed in between (visible to
// the snapshot, with a later now() of its own) would look longer than the
// lease it was granted; and it is read before any lock wait of the
// statement (ON CONFLICT waits for a concurrent transaction on the same
// row), after which the lease has really run for longer. clock_timestamp()
// is read after both, so it is the true current time and, the server's
// clock being monotonic, never earlier than the time stamped by a write the
// snapshot shows; that floor keeps the remaining lease within the
// lease granted even if the server's wall clock is stepped back. Whether a
// lease has ended is judged by now() in the one statement that takes over
// (ON CONFLICT ... DO UPDATE ... WHERE lease_expires_at <= now()), where a
// stale now() errs on the safe side: it never takes over a live lease.
// What it misses (a lease that ended after now() was read: during a lock
// wait, or by a release that committed before the statement's snapshot)
// the statement reports as acquirable, judged by clock_timestamp(), and
// Acquire runs it again at once, with a later now().
//
// # Claims
//
// A claim is a plain INSERT ... ON CONFLICT DO NOTHING RETURNING, one row
// when it inserted the record: a new message costs that statement alone,
// whose plan holds the insert and nothing else (a statement that also
// read the committed record on a conflict, in a UNION ALL branch behind a
// one-time filter, cost a new message about 30% more server instructions,
// counted with callgrind, to set up and tear down a lookup it never ran). A claim that returned
// no row conflicted, and reads the record with a second statement,
// fingerprint: the hand-written consumer's order, one round trip more for
// a duplicate only. That statement's snapshot is its own, taken after the
// claim's wait, so it also sees a record committed by a concurrent
// transaction that the claim waited for; when it finds none (a purge
// deleted the record in between), the claim is made again. Where the
// claim is the first statement of a transaction the store began itself
// (store/idempgxv5's BeginClaim), the read is Record instead, pipelined
// with the ROLLBACK that ends that transaction, which also puts back the
// lock timeout; when the record is gone, the store begins again.
// Concurrency is the primary key's: a claim of a key that a concurrent
// transaction inserted waits for it, then claims (rolled back) or reports
// the record.
//
// The claim's lock timeout is set by the claim for itself, with no
// statement of its own (claimLockTimeout): the INSERT's source row sets
// it, saving the transaction's value in idem.lock_timeout, before the
// insert can wait, and the RETURNING of a new record, or the fingerprint
// read of a duplicate, puts the saved value back, so the handler's
// statements keep the session's setting.
//
// The batch claim is one statement with such a lookup branch, skipped
// when every message was new (one row then), and the lock timeout in a
// CTE (lockTimeoutCTE): its setup is paid once for the whole batch.
//
// # Transactional records
//
// A claim inserts consumer, message_id and fingerprint only: the
// lease-mode columns of a transactional record are NULL (state, token and
// attempt have no default since migration 006), which keeps the row
// narrow. Every statement reads a NULL state as completed (2), a NULL
// token as 0 and a NULL attempt as 1, the values of the records written
// before that migration: claims report it through sqlstore.State, the
// lease statements and Inspect through COALESCE, and the purge selects
// "state IS DISTINCT FROM 1" (state <> 1 would skip NULL rows). The
// fenced writes (renew, complete, release, saveStep) match state = 1
// only, which a NULL state never is.
package pgsql

import (
	"strings"
	"sync/atomic"

	"github.com/idem-go/idem/internal/sqlstore"
)

// Micros is the SQL expression of a timestamptz x as int64 microseconds
// since the epoch: exact on PostgreSQL 14 and later, where extract returns
// numeric.
func Micros(x string) string {
	return `(extract(epoch from ` + x + `) * 1000000)::bigint`
}

// TimeParam is the SQL expression of the timestamptz whose microseconds
// since the epoch are the bigint parameter param ("$2").
func TimeParam(param string) string {
	return `('epoch'::timestamptz + ` + param + `::bigint * interval '1 microsecond')`
}

// durationParam is the SQL expression of the interval whose microseconds
// are the bigint parameter param.
func durationParam(param string) string {
	return `(` + param + `::bigint * interval '1 microsecond')`
}

// lockTimeoutCTE is the CTE "lt" with which a batch claim sets its lock timeout
// for itself alone: it saves the transaction's lock_timeout and sets it
// to param (milliseconds, as text; NULL keeps it), in the claim's own
// round trip. The insert reads its rows FROM lt, so the setting is made
// before the insert can wait on a record another transaction holds, and
// restoreLockTimeout, the last branch of the statement's UNION ALL (run
// after the branches that read the insert), puts the saved value back,
// so the handler's statements that follow in the transaction keep the
// session's setting. A wait past it fails with SQLSTATE 55P03
// (lock_not_available), which WrapLockTimeout marks.
func lockTimeoutCTE(param string) string {
	return `lt AS MATERIALIZED (
	SELECT s.saved, set_config('lock_timeout', COALESCE(` + param + `::text, s.saved), true)
	FROM (SELECT current_setting('lock_timeout') AS saved OFFSET 0) AS s
)`
}

// restoreLockTimeout is the last branch of a claim's UNION ALL, whose
// first column is of type first: it returns no row, and puts back the
// lock_timeout that lockTimeoutCTE saved.
func restoreLockTimeout(first string) string {
	return `SELECT ` + first + `, NULL::bytea, NULL::smallint FROM lt WHERE set_config('lock_timeout', lt.saved, true) IS NULL`
}

// savedLockTimeout is the placeholder setting in which a claim keeps the
// transaction's lock_timeout while it runs with its own (set_config with
// is_local, so it ends with the transaction, as behind PgBouncer in
// transaction mode).
const savedLockTimeout = `'idem.lock_timeout'`

// claimLockTimeout is a condition, true, that saves the transaction's
// lock_timeout in savedLockTimeout and sets lock_timeout to param
// (milliseconds, as text; NULL keeps it). A claim's INSERT reads its row
// from a SELECT with this WHERE, so the setting is made before the insert
// can wait on a record another transaction holds. The arguments of the
// outer set_config are evaluated before it runs, so the value saved is
// the one before the change. A wait past it fails with SQLSTATE 55P03
// (lock_not_available), which WrapLockTimeout marks.
func claimLockTimeout(param string) string {
	return `set_config(` + savedLockTimeout + `, current_setting('lock_timeout') || left(set_config('lock_timeout', COALESCE(` + param + `::text, current_setting('lock_timeout')), true), 0), true) IS NOT NULL`
}

// restoreClaimLockTimeout is an expression, true, that puts back the
// lock_timeout claimLockTimeout saved.
const restoreClaimLockTimeout = `set_config('lock_timeout', current_setting(` + savedLockTimeout + `), true) IS NOT NULL`

// Queries holds the statements of one table, its name filled in once so
// that a driver's statement cache sees one text per statement.
type Queries struct {
	// Table is the processed-messages table as written in SQL.
	Table string
	// V2 is set on the statements of schema v2 (NewV2).
	V2 bool
	// keys are the consumers' keys that the Table of q resolved (v2), and
	// one, when set, the key of the one consumer of a Queries made for
	// one call (Table.Queries in a transaction that added the name): see
	// ConsumerArg.
	keys *keyCache
	one  any
	// Claim: consumer, message ID, fingerprint, lock timeout (ms as text,
	// or NULL) -> one row (true) when it inserted the record, with the
	// transaction's lock_timeout put back; no row on a conflict, with the
	// claim's lock_timeout still set, until fingerprint runs.
	Claim string
	// ClaimRead is Claim that also reads the record on a conflict, in the
	// same statement: consumer, message ID, fingerprint, lock timeout ->
	// one row, (true, NULL, NULL) when it inserted the record; (false,
	// fingerprint, state) when it conflicted with a record committed
	// before the statement began; (false, NULL, NULL) when its snapshot
	// does not show the record (committed by a transaction the insert
	// waited for, or deleted since), which fingerprint then reads with a
	// snapshot of its own. The lock_timeout is put back in every case. It
	// saves a duplicate the round trip of the second statement, and costs
	// a new message the setup of a read behind a one-time filter that it
	// does not run (see the package comment, "Claims").
	ClaimRead string
	// fingerprint: consumer, message ID -> one row: the record's
	// fingerprint and state, both NULL when there is no record; it first
	// puts back the lock_timeout a Claim that returned no row saved.
	fingerprint string
	// Record: consumer, message ID -> the record's fingerprint and state,
	// no row when there is none: the read of a claim that conflicted as
	// the first statement of its transaction, sent with the ROLLBACK that
	// ends it (which also puts back the lock_timeout the claim set, so
	// the read does not).
	Record string
	// claimBatch: consumer, text[] of IDs, text[] of hex fingerprints,
	// lock timeout (ms as text, or NULL) ->
	// one row (NULL, NULL, NULL) when every message was inserted, else
	// (message ID, NULL, NULL) per inserted message and (message ID,
	// fingerprint, state) per record committed before the statement.
	claimBatch string
	// claimBatchNative is claimBatch with the IDs and fingerprints as
	// native arrays (text[] and bytea[] parameters), for NativeArrays.
	claimBatchNative string
	// NativeArrays makes the batch claim send its IDs and fingerprints as
	// []string and [][]byte, which the driver encodes as arrays (pgx
	// does; database/sql drivers need not), instead of array literals in
	// strings with hex fingerprints that the server parses and decodes.
	NativeArrays bool
	// fingerprints: consumer, text[] of IDs -> message ID, fingerprint,
	// state.
	fingerprints string

	// acquire: consumer, message ID, fingerprint, lease (µs) -> acquired,
	// then the columns of sqlstore.LeaseRecord (see the function acquire).
	acquire string
	// acquireStep is acquire with a fifth parameter, a step prefix (not
	// empty): when it acquires, the same statement saves the recovery
	// point prefix || token.
	acquireStep string
	// steps: consumer, message ID -> step, result.
	steps string
	// acquireBatchTexts, and acquireBatchStepTexts when an element has a
	// step prefix: see the function acquireBatch.
	acquireBatchTexts, acquireBatchStepTexts batchTexts
	// completeBatchTexts: see the function completeBatch.
	completeBatchTexts batchTexts
	// batchWrites counts the records acquired through the batch acquire
	// statement (planGeneration); shared by copies of the Queries.
	batchWrites *atomic.Uint64
	// batchBase is the table's row count as its statistics estimated it
	// (pg_class.reltuples, 0 when never estimated) when its shape was
	// last found (Table.Shape), from which planGeneration counts the
	// records; shared by copies of the Queries.
	batchBase *atomic.Uint64
	// renew: lease (µs), consumer, message ID, token.
	renew string
	// complete: result, content type, consumer, message ID, token.
	complete string
	// release: error text, terminal (bool), consumer, message ID, token.
	release string
	// releaseStep: release's arguments, then a step -> 1 when the token
	// owned the record (released, and the step saved in the same
	// statement, or kept when it existed), 0 otherwise.
	releaseStep string
	// saveStep: consumer, message ID, token, step, result -> 1 when the
	// token owns the record (the step is then saved, or was already).
	saveStep string

	// purgeBatch: consumer, horizon (µs), limit -> records deleted; on
	// schema v2 the consumer's key, horizon, limit, the consumer's name
	// (DeleteRows finds the key).
	purgeBatch string
	// consumerKey (v2): consumer name -> its key, no row when it has none.
	consumerKey string
	// Inspect and Stats: see sqlstore.Inspect and sqlstore.Stats.
	Inspect, Stats string
	// Runs are the retention statements (MarkRunning is one statement,
	// Runs.Extend).
	Runs sqlstore.RunQueries
	// Migrations is the migrations table.
	Migrations sqlstore.MigrationTable
}

// New returns the statements of table t (validated by
// sqlschema.ParseTable) in schema v1: the consumer name in each row.
func New(t string) *Queries { return newQueries(layout{t: t}) }

// NewV2 returns the statements of table t in schema v2 (migrations 014
// and 015) with the point column (migration 016): each row holds its
// consumer's key, consumer_key (smallint). The per-message statements
// take the key as their consumer parameter (ConsumerArg); the operator's
// statements take the name and find its key in t's consumers table (see
// layout).
func NewV2(t string) *Queries { return newQueries(layout{t: t, v2: true, point: true}) }

// newV2NoPoint returns the statements of table t in schema v2 before
// migration 016: every recovery point written to the steps table.
func newV2NoPoint(t string) *Queries { return newQueries(layout{t: t, v2: true}) }

// newQueries returns the statements of l's table in l's shape.
func newQueries(l layout) *Queries {
	t := l.t
	steps, runs := t+`_steps`, t+`_runs`
	pk := l.byKey(`$1`, `$2::text`)
	// The recovery points keep the consumer's name: on v2 the statements
	// that write one take it as their last parameter.
	stepName := func(v1, v2 string) string {
		if l.v2 {
			return v2
		}
		return v1
	}
	return &Queries{
		Table: t,
		V2:    l.v2,
		Claim: `INSERT INTO ` + t + ` (` + l.col() + `, message_id, fingerprint)
SELECT ` + l.val(`$1`) + `, $2::text, $3::bytea WHERE ` + claimLockTimeout(`$4`) + `
ON CONFLICT (` + l.col() + `, message_id) DO NOTHING
RETURNING ` + restoreClaimLockTimeout,
		// The put-back runs first, on the one row of lt, whether or not a
		// record is found.
		fingerprint: `SELECT r.fingerprint, r.state FROM (SELECT ` + restoreClaimLockTimeout + `) AS lt
LEFT JOIN ` + t + ` AS r ON ` + pk,
		Record: `SELECT fingerprint, state FROM ` + t + ` WHERE ` + pk,
		// The second branch's put-back runs on the one row of lt, the
		// outer side of the LEFT JOIN, whether or not a record is found.
		ClaimRead: `WITH ins AS (
	INSERT INTO ` + t + ` (` + l.col() + `, message_id, fingerprint)
	SELECT ` + l.val(`$1`) + `, $2::text, $3::bytea WHERE ` + claimLockTimeout(`$4`) + `
	ON CONFLICT (` + l.col() + `, message_id) DO NOTHING
	RETURNING ` + restoreClaimLockTimeout + `
)
SELECT true, NULL::bytea, NULL::smallint FROM ins
UNION ALL
SELECT false, r.fingerprint, r.state FROM (SELECT ` + restoreClaimLockTimeout + ` WHERE NOT EXISTS (SELECT FROM ins)) AS lt
LEFT JOIN ` + t + ` AS r ON ` + pk,
		claimBatch:       claimBatch(l, `decode(u.fp, 'hex')`, `$3::text[]`),
		claimBatchNative: claimBatch(l, `u.fp`, `$3::bytea[]`),
		fingerprints:     `SELECT r.message_id, r.fingerprint, r.state FROM ` + l.recordsOf(`$2::text[]`),

		acquire:               acquire(l, ""),
		acquireStep:           acquire(l, steps),
		acquireBatchTexts:     newBatchTexts(acquireBatch(l, "", false), acquireBatch(l, "", true)),
		acquireBatchStepTexts: newBatchTexts(acquireBatch(l, steps, false), acquireBatch(l, steps, true)),
		batchWrites:           new(atomic.Uint64),
		batchBase:             new(atomic.Uint64),
		completeBatchTexts:    newBatchTexts(completeBatch(l, false), completeBatch(l, true)),
		// The steps table has no index but its key.
		steps: l.stepsRead(steps),
		renew: `UPDATE ` + t + ` SET lease_expires_at = now() + ` + durationParam(`$1`) + `, updated_at = now()
WHERE ` + l.byKey(`$2`, `$3::text`) + ` AND state = 1 AND token = $4::bigint`,
		complete: `UPDATE ` + t + ` SET state = 2, result = $1::bytea, content_type = $2::text,
	lease_expires_at = now(), processed_at = now(), updated_at = NULL
WHERE ` + l.byKey(`$3`, `$4::text`) + ` AND state = 1 AND token = $5::bigint`,
		release: `UPDATE ` + t + ` SET state = CASE WHEN $2::boolean THEN 3 ELSE 1 END, token = token + 1, last_error = $1::text,
	lease_expires_at = now(), processed_at = now(), updated_at = NULL
WHERE ` + l.byKey(`$3`, `$4::text`) + ` AND state = 1 AND token = $5::bigint`,
		// The release and its recovery point: the INSERT runs on the row
		// the UPDATE changed (and locked), in the same statement.
		releaseStep: `WITH rel AS (
	UPDATE ` + t + ` SET state = CASE WHEN $2::boolean THEN 3 ELSE 1 END, token = token + 1, last_error = $1::text,
		lease_expires_at = now(), processed_at = now(), updated_at = NULL
	WHERE ` + l.byKey(`$3`, `$4::text`) + ` AND state = 1 AND token = $5::bigint
	RETURNING 1
), point AS (
	INSERT INTO ` + steps + ` (consumer, message_id, step, result, created_at)
	SELECT ` + stepName(`$3`, `$7`) + `::text, $4::text, $6::text, ''::bytea, now() FROM rel
	ON CONFLICT (consumer, message_id, step) DO NOTHING
)
SELECT count(*) FROM rel`,
		// FOR SHARE conflicts with the row lock of a takeover, Complete or
		// Release; under READ COMMITTED the owner check is then made again
		// on the row they committed, so a stale owner's step is never
		// saved after a takeover. The INSERT runs whether or not the outer
		// SELECT reads it (a data-modifying CTE always runs).
		saveStep: `WITH owner AS (
	SELECT FROM ` + t + `
	WHERE ` + pk + ` AND state = 1 AND token = $3::bigint
	FOR SHARE
), ins AS (
	INSERT INTO ` + steps + ` (consumer, message_id, step, result, created_at)
	SELECT ` + stepName(`$1`, `$6`) + `::text, $2::text, $4::text, $5::bytea, now() FROM owner
	ON CONFLICT (consumer, message_id, step) DO NOTHING
)
SELECT count(*) FROM owner`,

		// See layout.purgeBatch.
		purgeBatch:  l.purgeBatch(steps),
		consumerKey: `SELECT key FROM ` + t + `_consumers WHERE name = $1::text`,
		Inspect: `SELECT fingerprint, ` + Micros(`processed_at`) + `, COALESCE(state, 2)::bigint, COALESCE(token, 0), COALESCE(attempt, 1)::bigint, ` + Micros(`lease_expires_at`) + `, last_error, result, content_type
FROM ` + t + ` WHERE ` + l.byName(`$1`, `$2::text`),
		Stats: l.stats(),
		Runs: sqlstore.RunQueries{
			// One statement: extend the newest run to now when the gap
			// ($2 µs) is positive and the run ended no more than the gap
			// ago (judged again on the latest version of the row, under
			// READ COMMITTED), else add a run [now, now], merged with one
			// that starts at the same instant.
			Extend: `WITH newest AS (
	SELECT started_at FROM ` + runs + ` WHERE consumer = $1::text ORDER BY started_at DESC LIMIT 1
), ext AS (
	UPDATE ` + runs + ` AS r SET ended_at = GREATEST(r.ended_at, now())
	FROM newest
	WHERE r.consumer = $1::text AND r.started_at = newest.started_at
		AND $2::bigint > 0 AND r.ended_at >= now() - ` + durationParam(`$2`) + `
	RETURNING 1
)
INSERT INTO ` + runs + ` AS r (consumer, started_at, ended_at)
SELECT $1::text, now(), now() WHERE NOT EXISTS (SELECT FROM ext)
ON CONFLICT (consumer, started_at) DO UPDATE SET ended_at = GREATEST(r.ended_at, excluded.ended_at)`,
			Runs:  `SELECT ` + Micros(`started_at`) + `, ` + Micros(`ended_at`) + ` FROM ` + runs + ` WHERE consumer = $1::text ORDER BY started_at`,
			Count: `SELECT count(*) FROM ` + t + ` WHERE ` + l.plain(`$1`) + ` AND processed_at < ` + TimeParam(`$2`) + ` AND state IS DISTINCT FROM 1`,
			Prune: `DELETE FROM ` + runs + ` WHERE consumer = $1::text AND ended_at < ` + TimeParam(`$2`),
		},
		Migrations: sqlstore.MigrationTable{
			Name: t + `_migrations`,
			Create: `CREATE TABLE IF NOT EXISTS ` + t + `_migrations (
	version    int PRIMARY KEY,
	applied_at timestamptz NOT NULL DEFAULT now()
)`,
			Record: `INSERT INTO ` + t + `_migrations (version, applied_at) VALUES ($1, now())`,
		},
	}
}

// Keyed returns, by name, q's statements that find records of the
// processed table by consumer and message ID (through byKey), for a check
// of their plans: a test needs to know each one's parameters.
func (q *Queries) Keyed() map[string]string {
	return map[string]string{
		"fingerprint": q.fingerprint, "record": q.Record, "claimRead": q.ClaimRead, "fingerprints": q.fingerprints,
		"claimBatch": q.claimBatch, "claimBatchNative": q.claimBatchNative,
		"acquire": q.acquire, "acquireStep": q.acquireStep, "renew": q.renew, "complete": q.complete, "release": q.release, "releaseStep": q.releaseStep,
		"saveStep": q.saveStep, "purgeBatch": q.purgeBatch, "inspect": q.Inspect,
	}
}

// byKey is the condition that selects the record of consumer c (a text
// parameter) and message ID id on the processed table. The consumer is
// compared with the value of an uncorrelated subquery (an InitPlan), whose
// value the planner does not see when it plans the statement: it
// estimates the condition from the number of distinct consumers in the
// column's statistics. Compared with the parameter itself, a consumer that
// is rare or absent in those statistics (one new on a table that holds
// another consumer's records, until autovacuum analyzes the table again,
// after a tenth of its rows changed) looks like a row or two, and the
// planner may read its records through the default layout's retention
// index, (consumer, processed_at), filtering every record of the consumer
// by message ID, instead of probing the primary key: a read that grows
// with the consumer's records, on every custom plan (the first five
// executions of a prepared statement, and every execution without one,
// as behind PgBouncer). Measured with 200,000 records of such a consumer:
// 25 to 55 ms for one redelivery's claim, 3.6 s for a batch of 100.
func byKey(c, id string) string {
	return consumerIs(c) + ` AND message_id = ` + id
}

// consumerIs is byKey's comparison of the consumer with parameter c.
func consumerIs(c string) string {
	return `consumer = (SELECT ` + c + `::text)`
}

// recordsOf is the FROM clause of the records of consumer $1 on table t
// whose message IDs are in the text[] expression ids, as "r" (columns
// message_id, fingerprint, state): a probe of the primary key per ID, in a
// LATERAL subquery with both key columns equal (LIMIT 1 keeps it a nested
// loop the planner cannot turn into a join). Not message_id = ANY (ids):
// on a table without column statistics (new, restored, upgraded with
// pg_upgrade, or a new bucket's partition, until it is analyzed) the
// planner takes consumer = $1 to match 0.5% of the rows and prefers a scan
// by consumer alone, filtering the IDs, which reads every record of the
// consumer per statement.
func recordsOf(t, ids string) string {
	return `unnest(` + ids + `) AS u(id),
	LATERAL (SELECT message_id, fingerprint, state FROM ` + t + ` WHERE ` + byKey(`$1`, `u.id`) + ` LIMIT 1) AS r`
}

// claimBatch is the batch claim statement on table t, whose fingerprints
// parameter is fps (an array expression of $3) and each of whose
// elements u.fp becomes a fingerprint through fp.
func claimBatch(l layout, fp, fps string) string {
	return `WITH ` + lockTimeoutCTE(`$4`) + `, ins AS (
	INSERT INTO ` + l.t + ` (` + l.col() + `, message_id, fingerprint)
	SELECT ` + l.val(`$1`) + `, u.id, ` + fp + ` FROM lt, unnest($2::text[], ` + fps + `) AS u(id, fp)
	ON CONFLICT (` + l.col() + `, message_id) DO NOTHING
	RETURNING message_id
), n AS (
	SELECT count(*) = cardinality($2::text[]) AS all_claimed FROM ins
)
SELECT NULL::text, NULL::bytea, NULL::smallint WHERE (SELECT all_claimed FROM n)
UNION ALL
SELECT message_id, NULL::bytea, NULL::smallint FROM ins WHERE NOT (SELECT all_claimed FROM n)
UNION ALL
SELECT r.message_id, r.fingerprint, r.state FROM ` + l.recordsOf(`$2::text[]`) + `
WHERE NOT (SELECT all_claimed FROM n)
UNION ALL
` + restoreLockTimeout(`NULL::text`)
}

// acquire is the acquire statement on table t, which saves the recovery
// point of its step prefix ($5) on the steps table steps when it
// acquires (on a table with the point column, l.point, that of a new
// record in the record itself: one row written instead of two); steps is
// "" for the statement without a prefix, which a lease-mode claim
// without a recovery point runs (the common case): a plan without the
// steps table, which every execution would otherwise lock and set up.
//
// One statement inserts a new record, or takes over an expired one (the
// DO UPDATE runs only when its WHERE holds, judged on the latest
// committed version of the row, which ON CONFLICT locks), and otherwise
// reads the record as of the statement's snapshot, in a branch with a
// one-time filter on "up", so a new message costs the INSERT alone. The
// snapshot misses a record committed by a transaction the insert waited
// for (no row at all), and may show an older version than the one the
// WHERE saw: a record that could be taken over although the DO UPDATE
// did not take it. It may also show a lease that ended after the
// statement's now() was read (a release that began after it and
// committed before the snapshot; a lease that ran out during a lock
// wait), which the WHERE, judged by that now(), did not take: the last
// column judges by clock_timestamp(), read after the snapshot, so such a
// record is acquirable too. In all these cases Acquire runs the statement
// again, whose now() is later.
//
// Only a renewal sets updated_at (to when it extended the lease): the
// insert and the takeover, like Complete and Release, set it to NULL and
// stamp processed_at with now(), when they set the lease, which keeps
// 8 bytes out of each row version they write and of its WAL. The
// remaining lease's floor is therefore the later of the two (GREATEST
// skips a NULL).
func acquire(l layout, steps string) string {
	// With a point column, a new record's recovery point (token 1) is
	// kept in the record; a takeover's goes to the steps table.
	pointCol, pointVal, taken := "", "", ""
	if steps != "" && l.point {
		pointCol, pointVal, taken = `, point`, `, $5::text || '1'`, ` WHERE up.token > 1`
	}
	q := `WITH up AS (
	INSERT INTO ` + l.t + ` AS r (` + l.col() + `, message_id, fingerprint, processed_at, state, token, attempt, lease_expires_at` + pointCol + `)
	VALUES (` + l.val(`$1`) + `, $2::text, $3::bytea, now(), 1, 1, 1, now() + ` + durationParam(`$4`) + pointVal + `)
	ON CONFLICT (` + l.col() + `, message_id) DO UPDATE
	SET token = COALESCE(r.token, 0) + 1, attempt = COALESCE(r.attempt, 1) + 1, lease_expires_at = excluded.lease_expires_at,
		processed_at = excluded.processed_at, updated_at = NULL
	WHERE r.state = 1 AND r.lease_expires_at <= now() AND r.fingerprint = excluded.fingerprint
	RETURNING r.token, r.attempt
)`
	if steps != "" {
		name := `$1` // the recovery point's consumer name (v2: the last parameter)
		if l.v2 {
			name = `$6`
		}
		q += `, point AS (
	INSERT INTO ` + steps + ` (consumer, message_id, step, result, created_at)
	SELECT ` + name + `::text, $2::text, $5::text || up.token::text, ''::bytea, now() FROM up` + taken + `
	ON CONFLICT (consumer, message_id, step) DO NOTHING
)`
	}
	return q + `
SELECT true, 0::bigint, token::bigint, attempt::bigint, NULL::bytea, 0::bigint, NULL::bytea, NULL::text, NULL::text, false FROM up
UNION ALL
SELECT false, COALESCE(state, 2)::bigint, COALESCE(token, 0), COALESCE(attempt, 1)::bigint, fingerprint,
	CASE WHEN state = 1 AND lease_expires_at > now()
	THEN GREATEST(` + Micros(`lease_expires_at`) + ` - ` + Micros(`GREATEST(clock_timestamp(), updated_at, processed_at)`) + `, 0) ELSE 0 END,
	result, content_type, last_error,
	COALESCE(state = 1 AND lease_expires_at <= clock_timestamp() AND fingerprint = $3::bytea, false)
FROM ` + l.t + `
WHERE ` + l.byKey(`$1`, `$2::text`) + ` AND NOT EXISTS (SELECT FROM up)`
}

// Lock statements, all transaction-scoped so that they work behind a
// pooler in transaction mode (PgBouncer), where a session lives only as
// long as a transaction: the purge lock is held by a transaction that
// spans the purge, the migration lock by the migration's transaction.
// Keys come from sqlstore.LockKey. Transaction and session advisory locks
// share one key space, so these also exclude a process that takes the
// same key with pg_try_advisory_lock (idem before this change).
const (
	// TryXactLock: key -> whether the transaction holds the lock, without
	// waiting; true again when the transaction already holds it.
	TryXactLock = `SELECT pg_try_advisory_xact_lock($1::bigint)`
	// LockIdle is the idle_in_transaction_session_timeout of a
	// transaction that holds a lock (the purge's, which idles while the
	// purge's statements run elsewhere, and the migration's), set for
	// that transaction only: a shorter one (idem's command sets 30s)
	// does not end it during a long count, batch or index build, while a
	// holder that hangs still loses its lock.
	LockIdle = "1h"
)

// TextArray renders ss as a PostgreSQL array literal ('{"a","b"}'), sent
// as a string parameter and cast with ::text[] in SQL, so that every
// driver can send it. Every element is quoted, so none is read as NULL or
// loses spaces.
func TextArray(ss []string) string {
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

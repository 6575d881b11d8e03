// Package idemsql is idem's store over database/sql: an [idemdriver.TxStore] of
// *sql.Tx for PostgreSQL, MariaDB/MySQL and SQLite. Handlers receive the
// *sql.Tx that holds the message's claim and write their side effects with
// it, so the claim and the effects commit or roll back together. It is also
// an [idemdriver.LeaseStore], for [idem.LeaseConsumer] and side effects outside
// the database (see "Lease mode" below).
//
// The store takes the caller's *sql.DB and imports no driver: open the
// database with the driver of your choice and name its [Dialect].
//
//	db, err := sql.Open("sqlite", idemsql.SQLiteDSN("/var/lib/app/app.db")) // modernc.org/sqlite
//	store, err := idemsql.New(db, idemsql.SQLite, nil)
//	err = store.Migrate(ctx) // or `idem migrate`
//	consumer, err := idem.NewConsumer[*sql.Tx](store, idem.Config{Name: "payments"})
//	out, err := consumer.Process(ctx, msg, func(ctx context.Context, tx *sql.Tx, msg idem.Message) error {
//		_, err := tx.ExecContext(ctx, `INSERT INTO payments ...`)
//		return err
//	})
//
// Tested with github.com/jackc/pgx/v5/stdlib, github.com/go-sql-driver/mysql
// and modernc.org/sqlite. For PostgreSQL on pgx without database/sql, use
// store/idempgxv5, which shares this store's PostgreSQL statements (one
// source, internal/pgsql), schema, migrations table and lock keys.
//
// # Schema and byte-exact IDs
//
// Migrate creates the processed-messages table (default idem_processed;
// see [Config]) with the primary key (consumer, message_id) and an index on
// (consumer, processed_at), from the migrations embedded in idem; migration
// 002 adds the lease-mode columns and the recovery points table Table +
// "_steps" (see "Lease mode"). On PostgreSQL, migrations 014 and 015
// (schema v2) store each consumer name once, in Table + "_consumers", and
// key the records by (consumer_key smallint, message_id), upgrading a table in use
// without blocking its writers; the Store finds the table's shape when it
// first uses it, and again when 015 changes it under the Store (a claim in
// the caller's transaction then fails with SQLSTATE 42703 and the message
// is delivered again; a statement the Store runs on its own is made again
// at once): see store/idempgxv5's package documentation, "Upgrading to
// schema v2". The Store finds each consumer's key once and passes it as a
// statement parameter; a table holds at most 32,767 consumer names, and a
// new one beyond that fails with an error matching [ErrTooManyConsumers].
// Deploy this version before running 015. On MySQL, migration 006 makes
// the lease-mode columns state, token and attempt nullable (see "Lease
// mode"), rebuilding the table online (ALGORITHM=INPLACE, LOCK=NONE:
// writers go on). Upgrade in this order: deploy a version that reads
// these NULLs (this one) first, then migrate; older binaries cannot read
// the NULLs of the transactional records written after it (Inspect, a
// lease-mode Acquire of such a record) and their purge skips those
// records. The rebuild takes the table's metadata lock exclusively for a
// moment at its start and at its end, which a transaction that has used
// the table (a handler still running) holds off, while every new
// statement on the table queues behind the waiting ALTER. So Migrate runs
// MySQL migrations with the session's lock_wait_timeout at 1 second (put
// back afterwards): past it a statement gives way (error 1205, MariaDB's
// too) and runs again after a pause (100 ms, doubling up to 5 s) until it
// gets the lock or ctx ends; a claim then waits about a second at most
// for each try. When ctx ends first, Migrate returns an error matching
// idemdriver.ErrLockTimeout and ctx's error, the table as it was. A try
// that gives way at the end of the rebuild throws the rebuild away (the
// next one starts over): on a large table, migrate while no transaction
// on it runs for long. Message
// IDs and consumer names are compared byte for byte on every dialect,
// whatever the server's default collation: text COLLATE "C" on PostgreSQL,
// VARBINARY on MySQL (a utf8mb4_general_ci server would otherwise find
// "abc", "ABC" and "abc " equal), and TEXT with SQLite's default BINARY
// collation. IDs that differ in case, trailing spaces or Unicode
// normalisation are different messages.
//
// # Duplicate detection
//
// A claim is an INSERT that a duplicate never turns into an error, so the
// caller's transaction stays usable, and duplicates are
// told from new rows by what the server reports, never by error text:
//
//   - PostgreSQL: INSERT ... ON CONFLICT (consumer_key, message_id) DO NOTHING
//     RETURNING. SQLSTATE 23505 is never raised, let alone caught: on
//     PostgreSQL any error aborts the whole transaction.
//   - SQLite: INSERT ... ON CONFLICT DO NOTHING, judged by rows affected
//     (batches: RETURNING). Not INSERT OR IGNORE, which would also swallow
//     NOT NULL and CHECK violations.
//   - MySQL: INSERT ... ON DUPLICATE KEY UPDATE, whose update clause leaves
//     the row as it is. Rows affected is not trusted: with the
//     clientFoundRows=true DSN setting (CLIENT_FOUND_ROWS) it counts a
//     duplicate as 1, exactly like a new row, and a store judging by it
//     would run the handler of a message processed before. Instead the
//     update clause, which runs only for a duplicate, sets bit i of
//     LAST_INSERT_ID for the statement's i-th row, and the server reports
//     that value to the client as the statement's insert ID: a per-row
//     bitmask of duplicates, whatever the DSN says (both settings are
//     tested). Not INSERT IGNORE, which turns other errors into warnings.
//     The session's LAST_INSERT_ID() is left at that bitmask (0 when there
//     was no duplicate); read your own AUTO_INCREMENT IDs from the result
//     of your own INSERT, as database/sql does anyway.
//
// A duplicate's stored fingerprint is read in a way that sees a record
// committed by a concurrent transaction the insert waited for: on
// PostgreSQL (READ COMMITTED) by a statement of its own after the claim's
// INSERT, whose snapshot is taken after the wait (a new message costs the
// INSERT alone, a duplicate the INSERT and that read); on MySQL (REPEATABLE READ, whose snapshot may predate the
// record) by a locking read, LOCK IN SHARE MODE, on the primary key of rows
// the claim has already locked.
//
// Isolation: the store's own transactions ([Store.Begin]) use the
// database's default. A caller's transaction passed to ProcessTx may use
// another level; on PostgreSQL under REPEATABLE READ or SERIALIZABLE a
// conflict with a record committed after the transaction's snapshot is a
// serialization failure (SQLSTATE 40001): the transaction must be retried,
// and nothing wrong is recorded.
//
// # Batches
//
// ClaimBatchTx claims N messages with one INSERT and reads the stored
// fingerprints of the duplicates with at most one more statement. IDs are
// inserted in byte order, so batches that overlap lock rows in the same
// order and do not deadlock. On PostgreSQL the INSERT takes the IDs and
// fingerprints as two arrays (INSERT ... SELECT FROM unnest(...) ON
// CONFLICT DO NOTHING RETURNING message_id), sent as text literals so that
// any driver works, or, with pgx's stdlib, as native text[] and bytea[]
// parameters (no hex fingerprints to encode and decode; see [Postgres]).
// On SQLite it is an INSERT ... SELECT of a VALUES list
// ... ON CONFLICT DO NOTHING RETURNING, split past 400 rows. On MariaDB
// 10.5 and later it is a multi-row INSERT IGNORE ... RETURNING message_id
// (IGNORE can only skip a taken key here: every value fits its column,
// checked before the statement runs), then, only when some rows were not
// returned, one locking read of their fingerprints: the statements a
// hand-written batch consumer runs. The statement texts are built once per
// batch size.
//
// # MySQL batch claims
//
// On a server without RETURNING (MySQL; MariaDB before 10.5), found by
// SELECT VERSION() at a Store's first batch claim, the claim is as
// follows. MySQL has no RETURNING, and a multi-row INSERT reports one rows-affected
// total, which says how many rows were duplicates (when clientFoundRows is
// off) but not which. Two ways to find out were rejected:
//
//   - comparing the set of IDs before and after: a plain SELECT reads a
//     snapshot, which under READ COMMITTED or an old REPEATABLE READ
//     snapshot misses records a concurrent transaction commits in between,
//     so one of its rows would be taken for ours and its message processed
//     twice; a locking SELECT before the INSERT takes gap locks on the
//     missing IDs, and two batches holding gap locks on the same gap then
//     deadlock on their inserts;
//   - inserting, rolling back to a savepoint and retrying: the rolled-back
//     rows leave gap locks behind, with the same deadlocks.
//
// So the duplicate bitmask above does it in the INSERT itself: one
// statement per 64 messages (the width of LAST_INSERT_ID), exact per row,
// waiting on the primary key like any insert, then one locking read of the
// duplicates' fingerprints, forced onto the primary key so that it locks
// the duplicate rows (which the claim holds already) and nothing else. The
// conformance suite runs eight overlapping batches at once on both DSN
// settings without a deadlock.
//
// # Time
//
// Every time comes from the database server's clock, never from Go's:
// processed_at is now() on PostgreSQL (the transaction's start),
// UTC_TIMESTAMP(6) on MySQL (a UTC DATETIME(6)) and SQLite's clock in Unix
// microseconds on SQLite (with SQLite's millisecond precision). So are
// the runs of the consumer that retention counts (see "Purging"), and
// lease expiries and remaining leases (see "Lease mode").
// Times cross the driver as integer microseconds, so go-sql-driver's
// parseTime and session time zones play no part; Go values are in UTC.
//
// # SQLite
//
// SQLite runs one writer at a time. The store needs three settings, which
// [SQLiteDSN] sets and [New] checks (returning a [SQLiteSettingError]):
//
//   - transactions begin with BEGIN IMMEDIATE (_txlock=immediate): they
//     take the write lock at once and queue for it under the busy timeout.
//     A deferred transaction that read first could not wait for the lock
//     when it writes; it would fail with SQLITE_BUSY. New probes this from
//     a second connection, since no PRAGMA reports it (except with
//     db.SetMaxOpenConns(1): no second connection, and within the process
//     nothing to wait for);
//   - a busy timeout (PRAGMA busy_timeout > 0), so writers wait instead of
//     failing at once;
//   - WAL journal mode for a file database, so readers do not block the
//     writer.
//
// An in-memory database (":memory:") is private to its connection, so it
// needs db.SetMaxOpenConns(1), which New checks. With a file, a few open
// connections are plenty: writers take turns anyway. SQLite's default
// synchronous=FULL makes every commit durable (an fsync of the WAL), which
// is what makes acknowledging a message after Process safe; it also bounds
// the commit rate of a disk, and batches amortise it.
//
// # Lease mode
//
// [idem.LeaseConsumer] claims a message with a lease instead of a
// transaction, for side effects the database cannot roll back (an HTTP
// call, an email). The store keeps lease-mode records in the same table,
// with more columns (migration 002):
//
//   - state: 1 in_progress, 2 completed, 3 failed (the values of
//     [idemdriver.RecordState]). On SQLite its default is 2, so the records
//     of transactional mode, whose claims write only the columns of
//     migration 001, are completed records, and tables from before the
//     migration keep their meaning. On PostgreSQL and MySQL, since their
//     migration 006, it has no default and is NULL in the records of
//     transactional mode (a narrower row), which every statement reads as
//     completed; the records written before keep their 2;
//   - token (bigint, default 0; NULL and read as 0 in the transactional
//     records of PostgreSQL and MySQL since migration 006), the fencing
//     token of the attempt that owns an in_progress record, and attempt
//     (default 1; NULL and read as 1 likewise), the attempts made;
//   - lease_expires_at, when the lease ends (timestamptz on PostgreSQL, a UTC
//     DATETIME(6) on MySQL, Unix microseconds on SQLite, like processed_at);
//   - result (bytea, LONGBLOB, BLOB; NULL for transactional records),
//     content_type and last_error;
//   - updated_at, the time of the last lease-mode write;
//
// and the table Table + "_steps" keeps the recovery points of multi-step
// handlers ([idem.Attempt.Step]), keyed by (consumer, message_id, step).
// On PostgreSQL since migration 016 the point that the acquisition of a
// new record saves ([idemdriver.AcquireParams.StepPrefix], token 1) is
// kept in the record's nullable column point instead, one row written
// instead of two (store/idempgxv5's package documentation, "Lease
// mode"); on MySQL and SQLite it is a row of Table + "_steps".
//
// The clock: lease expiry is judged by the database server's clock only.
// Acquire writes lease_expires_at as the server's now plus the lease
// (sent as whole microseconds, rounded up, so no positive lease becomes
// zero); a lease has ended when lease_expires_at <= now; the remaining
// lease an Acquire reports is lease_expires_at minus now, computed by the
// server in microseconds and returned as a time.Duration (one unit end to
// end). On PostgreSQL now() is the statement's transaction start, and the
// remaining lease is counted from clock_timestamp() instead (read after
// the statement's snapshot and any lock wait; store/idempgxv5's
// statements, see internal/pgsql); on MySQL UTC_TIMESTAMP(6), the time its
// statement began (so a read that may wait for a lock is made after the
// lock is held); on SQLite its clock, to the millisecond. Since a read's
// now can be a little earlier than the write it sees, the remaining lease
// is measured from updated_at (when the lease was set) if that is later:
// it is never more than the lease granted. Renewals set the expiry the
// same way. Go's clock is never read.
//
// [Store.Acquire] is atomic on each dialect; of concurrent calls (tested
// with 32 at once, on a new message, after an expiry and after a release)
// exactly one acquires:
//
//   - PostgreSQL: one statement, INSERT ... ON CONFLICT (consumer,
//     message_id) DO UPDATE SET token = token + 1, attempt = attempt + 1,
//     lease_expires_at = now() + lease ... WHERE state = 1 AND
//     lease_expires_at <= now() AND fingerprint = the caller's, RETURNING
//     the token, which also reads the record when it did not acquire it.
//     ON CONFLICT locks the conflicting row and judges the WHERE on its
//     latest committed version, so two callers cannot both take over. The
//     read sees the statement's snapshot; when that snapshot shows no
//     record (one a concurrent transaction committed while the insert
//     waited) or a record the WHERE would have taken (it changed since),
//     the statement runs again with a new snapshot. A takeover then reads
//     its recovery points with one more statement.
//   - MySQL: INSERT ... ON DUPLICATE KEY UPDATE of a new in_progress record,
//     whose insert ID says whether the record existed, as for transactional
//     claims (rows affected would not, see clientFoundRows). When it
//     existed, a plain read reports it, unless it can be taken over: then a
//     short transaction locks it (SELECT ... FOR UPDATE), reads it again
//     under the lock, updates it and reads its recovery points.
//   - SQLite: one BEGIN IMMEDIATE transaction: INSERT ... ON CONFLICT DO
//     UPDATE ... WHERE ... RETURNING, then a read.
//
// Fencing: [Store.Renew], [Store.Complete] and [Store.Release] are each
// one UPDATE whose WHERE is (consumer, message_id, state = in_progress,
// token = the attempt's token), judged by rows affected: 0 is
// [idem.ErrLeaseLost]. An expired lease that nobody took over is still
// owned, so a late finisher may complete. On MySQL every one of them
// changes a column (updated_at always moves forward by at least a
// microsecond, and the token or state change where they do), so rows
// affected is 1 on success with or without clientFoundRows. Complete sets
// the state, result and content type and keeps the fingerprint.
// Release ends the lease now, keeps the error text and moves the
// token on by one, so that the released attempt owns nothing; the next
// attempt's token is one more again (tokens strictly increase; they are not
// attempt numbers). [Store.SaveStep] inserts a recovery point only while
// the token owns the record, holding the record's row lock in share mode
// (so a takeover, which locks the row, either waits for the step and
// returns it, or is seen by it): on PostgreSQL one statement (INSERT ...
// SELECT FROM the record FOR SHARE ... ON CONFLICT DO NOTHING), on MySQL a
// short transaction (a LOCK IN SHARE MODE read of the record, then INSERT
// ... ON DUPLICATE KEY UPDATE), on SQLite one INSERT ... SELECT. The first
// result saved for a step is kept.
//
// Byte for byte: results and step results are stored as given (nil as
// empty), up to the server's limits (MySQL: LONGBLOB, and a statement is
// bounded by max_allowed_packet). Content types must be valid UTF-8
// without NUL bytes, at most [MaxContentTypeLength] bytes, and step names
// 1 to 255 such bytes (errors matching idem.ErrInvalidConfig otherwise),
// because PostgreSQL text cannot hold anything else; error texts are
// stored with invalid bytes and NULs replaced by U+FFFD, cut to
// [MaxErrorTextLength] bytes.
//
// One consumer name should use one mode. Across modes the table still
// answers consistently: a transactional claim of any existing record,
// in progress or not, is a duplicate; a lease Acquire of a transactional
// record finds it completed, with no result.
//
// # Connection pools
//
// Every claim holds a connection for the transaction's lifetime, handler
// included. Size db.SetMaxOpenConns for the number of messages processed at
// once plus, per purge, one (MySQL: the connection of its lock) or two
// (PostgreSQL: the lock's transaction, and the batches' statements). On
// MySQL, interpolateParams=true in the DSN saves a round trip per statement
// of the handlers (go-sql-driver otherwise prepares each statement on the
// server first, runs it and closes it). The store's own hot statements on
// MySQL and SQLite (the claim, the read of a duplicate's record, the
// fenced lease writes) are prepared once per connection whatever the DSN
// says, and stay prepared for the life of the *sql.DB (a few per
// connection, against MySQL's max_prepared_stmt_count). When the server
// refuses a prepare for that limit (error 1461), the store closes them
// and runs every statement from its text from then on, so that the
// handlers' statements find room.
//
// # BEGIN on PostgreSQL
//
// database/sql sends a transaction's BEGIN at DB.BeginTx and waits for
// it, so on PostgreSQL every message pays a round trip for BEGIN before
// its claim; store/idempgxv5 sends both in one. Where that round trip
// matters, use store/idempgxv5 (docs/benchmarks.md compares the two).
// A duplicate's ROLLBACK is a round trip of its own too (pgx pipelines it
// with the read of the record); after a duplicate, the store's next claim
// reads the record in the claim's own statement instead of a second one
// (see Store.ClaimTx), so that a run of duplicates costs three round trips
// each (BEGIN, the claim, ROLLBACK) instead of four.
//
// # Behind PgBouncer
//
// The PostgreSQL dialect works through PgBouncer in transaction pooling,
// every operation included (claims, batches, lease mode, purges,
// migrations, the outbox): it keeps no session state across
// transactions (its purge lock is pg_try_advisory_xact_lock held by a
// transaction that spans the purge; see store/idempgxv5's "Behind
// PgBouncer" for the reasons and the limits). With pgx's database/sql
// driver, choose a query exec mode that prepares no named statement
// (PgBouncer before 1.21 does not carry them across server connections)
// in the URL: default_query_exec_mode=cache_describe (or describe_exec,
// exec, simple_protocol). The conformance suites run through PgBouncer
// 1.18 in cache_describe and simple_protocol modes.
//
// # Lock timeout and stalled connections
//
// A claim given a idemdriver.ClaimParams.LockTimeout (the core gives half
// of idem.Config.StoreTimeout) bounds its wait for a transaction holding
// the same record, by the database, for the claim's statements only: on
// PostgreSQL as store/idempgxv5 does (SQLSTATE 55P03), on MariaDB 10.3.1
// and later with SET STATEMENT innodb_lock_wait_timeout=N FOR (whole
// seconds, rounded up; error 1205), written in a MariaDB executable
// comment that MySQL ignores: on MySQL set innodb_lock_wait_timeout in
// the DSN. Either error is wrapped in idemdriver.ErrLockTimeout. SQLite
// claims never wait on a record (the write lock is taken at BEGIN, under
// the busy timeout).
//
// The core's StoreTimeout reaches Begin, the claim, Commit and Rollback
// through their contexts; database/sql's transaction keeps the context it
// began with, so the core arms that context's deadline only around its
// own calls. go-sql-driver/mysql does not cancel a COMMIT by context: set
// readTimeout and writeTimeout in the DSN so a stalled connection fails
// anyway, and, on MariaDB, the session variable idle_transaction_timeout
// (PostgreSQL: idle_in_transaction_session_timeout), which ends a stalled
// session on the server and releases its locks. docs/architecture.md
// ("Deadlines") gives the values.
//
// # Purging
//
// Retention counts the consumer's running time, not the clock: idem.Purge
// (the core's policy) deletes a record only once its consumer has been
// running for the retention window since the record was written, so a
// consumer that was down for longer than the window still recognises the
// redeliveries of its downtime. The store keeps the runs in Table +
// "_runs" (migration 003), extended or added by [Store.MarkRunning], the
// running consumer's heartbeat. [Store.BeginPurge] takes the one-cleaner
// lock per table and consumer (a PostgreSQL transaction-scoped advisory
// lock held by a transaction that spans the purge, a MySQL
// GET_LOCK, or an in-process lock for SQLite, whose writers serialise
// across processes anyway) and returns the session that reads the runs
// and deletes bounded batches, each its own short transaction. It never
// deletes an in_progress lease record, however old, and deletes the
// recovery points of the records it deletes in the same transaction.
//
// # Operators
//
// [Store.Inspect] reads one record and [Store.Stats] summarises each
// consumer's records ([idemdriver.Inspector]), for `idem inspect` and
// `idem stats`.
package idemsql

// Package idemsql is idem's store over database/sql: an [idem.TxStore] of
// *sql.Tx for PostgreSQL, MariaDB/MySQL and SQLite. Handlers receive the
// *sql.Tx that holds the message's claim and write their side effects with
// it, so the claim and the effects commit or roll back together.
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
// store/idempgxv5, which shares this store's schema, migrations table and
// lock keys.
//
// # Schema and byte-exact IDs
//
// Migrate creates the processed-messages table (default idem_processed;
// see [Config]) with the primary key (consumer, message_id) and an index on
// (consumer, processed_at), from the migrations embedded in idem. Message
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
// caller's transaction stays usable (field case C05), and duplicates are
// told from new rows by what the server reports, never by error text:
//
//   - PostgreSQL: INSERT ... ON CONFLICT (consumer, message_id) DO NOTHING
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
// PostgreSQL (READ COMMITTED) by a new statement, whose snapshot is taken
// after the wait (the claim statement itself also returns the fingerprint
// when the record was committed before it began, so a plain redelivery costs
// one statement); on MySQL (REPEATABLE READ, whose snapshot may predate the
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
// any driver works. On SQLite it is a multi-row INSERT ... RETURNING,
// split past 400 rows.
//
// # MySQL batch claims
//
// MySQL has no RETURNING, and a multi-row INSERT reports one rows-affected
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
// microseconds on SQLite (with SQLite's millisecond precision). The purge
// horizon is computed by the server from the consumer's newest record.
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
// # Connection pools
//
// Every claim holds a connection for the transaction's lifetime, handler
// included. Size db.SetMaxOpenConns for the number of messages processed at
// once plus one per purge (which holds a connection for its lock). On
// MySQL, interpolateParams=true in the DSN saves a round trip per statement
// (go-sql-driver otherwise prepares each statement on the server first).
//
// # Purging
//
// [Store.Purge] deletes a consumer's records older than its newest record
// minus the retention window, in bounded batches, one autocommit DELETE per
// batch, with one cleaner at a time per table and consumer: a PostgreSQL
// advisory lock, a MySQL GET_LOCK, or an in-process lock for SQLite (whose
// writers serialise across processes anyway).
//
// # Operators
//
// [Store.Inspect] reads one record and [Store.Stats] summarises each
// consumer's records, for `idem inspect` and `idem stats`.
package idemsql

// Package idempgxv5 is idem's store for PostgreSQL on pgx v5
// (github.com/jackc/pgx/v5): an [idemdriver.TxStore] whose transactions are
// pgx.Tx, so a handler writes its side effects with the same transaction
// that holds the message's claim, and they commit or roll back together.
// It is also an [idemdriver.LeaseStore], for [idem.LeaseConsumer] and side
// effects outside the database (see "Lease mode" below).
//
// It takes the caller's *pgxpool.Pool and owns nothing else:
//
//	store, err := idempgxv5.New(pool, nil) // table "idem_processed"
//	if err != nil { ... }
//	if err := store.Migrate(ctx); err != nil { ... }
//	consumer, err := idem.NewConsumer[pgx.Tx](store, idem.Config{Name: "billing"})
//	...
//	out, err := consumer.Process(ctx, msg, func(ctx context.Context, tx pgx.Tx, msg idem.Message) error {
//		_, err := tx.Exec(ctx, "INSERT INTO invoices ...", ...)
//		return err
//	})
//
// # Schema
//
// [Store.Migrate] (or `idem migrate`) creates the processed-messages table
// from the migrations embedded in idem: one row per consumer and message
// ID, the ID text with the "C" collation (compared byte for byte, whatever
// the database's collation), the payload fingerprint (bytea) and
// processed_at (timestamptz, the server's now() when the claiming
// transaction began). The table name is configurable ([Config.Table]).
// Migration 002 adds the lease-mode columns and the recovery points table
// Table + "_steps" (see "Lease mode").
//
// Since migrations 014 and 015 (schema v2) each consumer name is stored
// once, in the table Table + "_consumers" (key smallint, name text COLLATE
// "C", unique), and a record refers to it by consumer_key: the primary key
// is (consumer_key, message_id), the retention index (consumer_key,
// processed_at), the failed records' index (consumer_key, processed_at,
// message_id) WHERE state = 3. A 2-byte key instead of the name in every
// row and index entry makes a primary key entry that of a hand-written
// table keyed by the message ID alone (48 bytes with a 36-character ID,
// against 56 with a name of 3 to 10 bytes, 64 with 11 to 18).
//
// A Store finds a consumer's key once (per name and Store) with one
// statement that reads the consumers table and adds the name when it is
// new, and from then on passes the key as a parameter of the claim, the
// duplicate's read, the lease statements and the batches, which probe
// nothing but the processed table. Keys are given in order (the largest
// plus one); a committed key is never changed, reused or deleted (a
// transaction that rolls back gives its new key back); a Store keeps a key only
// once its row is committed (a name added in a transaction of the
// caller's, [Store.ClaimTx], is looked up again until that transaction
// has committed). Do not delete rows of the consumers table, nor drop and
// re-create the table under running Stores. A table holds at most 32,767
// consumer names: a statement of a name beyond
// that fails with an error matching [ErrTooManyConsumers], and its
// messages are not acknowledged. The recovery points, runs and outbox
// tables keep the name. The partitioned layout keeps schema v1 (the name
// in its rows and key). See docs/schema.md in idem's repository.
//
// # Upgrading to schema v2
//
// Migration 014 adds the consumers table and the column while consumers
// of any version keep running (a trigger fills the key for rows written
// by the name alone, a backfill in batches, NOT NULL through a validated
// check, the new indexes built concurrently); migration 015 then swaps
// the primary key and drops the consumer column, in one catalog-only
// transaction. No statement holds the table's exclusive lock for longer
// than a second (lock_timeout 1s, tried again after a pause); the
// migration files say how each step is done. Deploy this version first,
// then run `idem migrate`: a Store finds the table's shape when it first
// uses it, and again when a statement fails because 015 changed it under
// the Store (SQLSTATE 42703: the consumer column is gone). In a
// transaction the Store began itself ([Store.BeginClaim],
// [Store.BeginClaimBatch], lease mode and its batches, retention,
// operator calls) the
// statement is made again at once in the new shape; in a transaction of
// the caller's ([Store.ClaimTx], [Store.ClaimBatchTx]) the error is
// returned, the transaction is aborted, and the message is not
// acknowledged: delivered again, it is processed once. A binary older
// than this one fails its claims after 015 in the same way, for good,
// until it is replaced.
//
// # Partitioned layout
//
// With [Config.Partitions] the table is range-partitioned by processed_at
// in time buckets ([Partitions]), for tables of many millions of records:
// inserts touch only the current bucket's partition (few full-page images
// after a checkpoint), and the purge drops whole partitions, which returns
// their space, instead of deleting rows. Each claim takes a
// transaction-scoped advisory lock on (table, consumer, message ID) in a
// statement before the one that looks the ID up in every partition and
// inserts it, which makes the ID unique across partitions; claims must run
// under READ COMMITTED ([ErrIsolation]), and each one costs a B-tree
// descent per live partition. Lease mode is not offered
// ([ErrLeaseUnsupported]). See docs/partitioned.md in idem's repository.
//
// # One round trip per claim
//
// [Store.BeginClaim], which [idem.Consumer.Process] uses, begins the
// transaction and claims the message in one network round trip: it sends
// a pgx.Batch whose first query is BEGIN (pgx's Batch.BeginTx, new in pgx
// v5.12.0) followed by the claim, on a connection it acquired from the
// pool. pgx pipelines the two (extended protocol, one Sync; one
// multi-statement simple query under QueryExecModeSimpleProtocol) and
// hands back its own transaction, which BeginClaim returns wrapped so that
// Commit and Rollback also give the connection back to the pool (as a
// *pgxpool.Tx's do). Per new message, Process then takes the round trips
// of a hand-written BEGIN; INSERT; COMMIT (three), the claim riding with
// BEGIN. A duplicate takes two, as a hand-written one does: the claim,
// then the read of the stored fingerprint and ROLLBACK, pipelined. The
// claim was the transaction's first statement and wrote nothing, so
// BeginClaim ends the transaction itself (idemdriver.ClaimResult.Ended)
// and the Consumer has nothing to roll back. What the claim still costs
// is its work on the server: an INSERT ... ON CONFLICT into a table with
// two indexes. A connection's first use of a statement adds one round
// trip to prepare it (pgx's statement cache); later uses reuse it.
//
// Since the handler's transaction is pgx's own, every pgx.Tx method works
// on it, LargeObjects and savepoint-based nested Begin included. The
// approaches not taken:
//   - pgx.TxOptions.BeginQuery alone: a begin query is run with Exec, whose
//     command tag cannot carry whether the claim inserted, nor the stored
//     fingerprint.
//   - Pool.SendBatch, whose *pgxpool.Tx holds the connection until its own
//     Commit or Rollback, each of which sends a statement: a duplicate
//     whose ROLLBACK rode with the read would then pay one more round trip
//     to give the connection back.
//   - A hand-written pgx.Tx over an acquired *pgxpool.Conn: it works, but
//     cannot offer LargeObjects (pgx builds those only for its own
//     transactions) and re-implements pgx's handling of connection state.
//   - Claiming before BEGIN, in the pipeline's implicit transaction, with
//     a statement that fails on a duplicate so that the BEGIN queued after
//     it is skipped and the duplicate costs one round trip and no ROLLBACK:
//     PostgreSQL computes a data-modifying statement's whole result before
//     sending any of it, so the stored fingerprint cannot come back from
//     the statement that fails, and reading it with a statement of its own
//     costs every new message one more statement; it also needs a
//     deliberate error (division by zero) as control flow.
//
// # The claim
//
// The claim is one statement, INSERT ... ON CONFLICT (consumer,
// message_id) DO NOTHING RETURNING, which returns a row when it inserted
// the record: a new message costs that statement alone. A claim that
// returned no row conflicted, and reads the committed record's
// fingerprint and state with a second statement, in one more round trip,
// so a redelivery learns it is a duplicate, and whether its payload
// matches. That is the hand-written consumer's order: a statement that
// also read the record on a conflict (a UNION ALL branch behind a
// one-time filter) saved a duplicate that round trip, but cost every new
// message a quarter more server work, to set up and tear down a lookup it
// never ran. A duplicate raises no error inside the database (SQLSTATE
// 23505 is never raised, let alone caught), so it never aborts the
// transaction: a claim made with [Store.ClaimTx] in the caller's own
// transaction ([idem.Consumer.ProcessTx]) leaves it usable. A concurrent
// copy of the same message waits on the primary key for the first
// transaction: if that commits, the copy is a duplicate (the second
// statement's snapshot, taken after the wait, shows the record); if it
// rolls back, the copy claims. Under REPEATABLE READ or SERIALIZABLE,
// PostgreSQL reports the first case as a serialization failure (SQLSTATE
// 40001) instead; retry the transaction.
//
// Every statement that finds a record by its key (the lookups, lease
// mode's statements, the purge's delete) compares the consumer with the
// value of a subquery, which the planner does not see: it then probes the
// primary key even for a consumer that the table's statistics do not know
// yet. With the value in view, such a consumer (new on a table that holds
// another consumer's records, until the next analyze) looks like a row or
// two, and a walk of the retention index (consumer, processed_at) by
// consumer alone looks as cheap, though it reads every record of the
// consumer: on a custom plan (the first five executions of a prepared
// statement, and every execution without one, as behind PgBouncer) a
// redelivery's claim then read 200,000 records.
//
// [Store.ClaimBatchTx] claims a whole batch with one INSERT ... SELECT FROM
// unnest($ids, $fingerprints) ... ON CONFLICT DO NOTHING RETURNING
// statement, built the same way: when every message was new it returns a
// single row and runs no lookup. It inserts in byte order of the IDs, so
// concurrent overlapping batches lock rows in the same order and do not
// deadlock.
//
// # Cost
//
// The claim of a new message costs no round trip of its own (BeginClaim
// is one round trip, which the tests verify), but its INSERT ... ON CONFLICT into a table with
// two indexes is server work that a transaction without deduplication does
// not do: about 45 to 90 µs of server CPU per message on the 2-vCPU test
// machine. Over a network, where a round trip takes half a millisecond or
// more, that is a small part of a message's cost. On loopback on that
// machine, where client and server share the CPU and a round trip costs
// about as much as the claim, Process measured between 0.63 and 0.92 of the
// throughput of a hand-written BEGIN; INSERT; COMMIT, a batch of 100 cost
// 11 to 18 times less per message than Process, and a duplicate 1.8 to 2.7
// times less than a new message. BenchmarkProcess measures these, with CPU
// time per message beside throughput.
//
// # Connections on errors
//
// A connection whose state is unknown is never handed back to the pool.
// When BeginClaim fails after BEGIN reached the server, it rolls back with
// a context detached from the caller's (bounded by 10 seconds); pgx closes
// the connection when that ROLLBACK fails, and the pool destroys closed
// connections, and connections still inside a transaction or busy, on
// release. A failed COMMIT likewise closes the connection unless the server
// reported the transaction ended. A transaction the handler left aborted
// (a failed statement) reports pgx.ErrTxCommitRollback at Commit, and
// nothing of it is kept. [Store.Rollback] after a failed or completed
// Commit returns nil.
//
// # Lock timeout and stalled connections
//
// A claim (BeginClaim, ClaimTx, ClaimBatchTx) given a
// idemdriver.ClaimParams.LockTimeout (the core gives half of
// idem.Config.StoreTimeout) sets PostgreSQL's lock_timeout for itself, in
// the claim statement (set_config, no extra round trip), and puts the
// transaction's previous value back before the handler's statements run.
// A claim that waits longer for a transaction holding the same record
// fails with SQLSTATE 55P03 wrapped in idemdriver.ErrLockTimeout; the
// connection stays usable. The core's StoreTimeout bounds a delivery's
// begin-and-claim, commit, rollback and emit through a deadline on the
// connection (Store.TimesCalls), cleared while the handler runs; a call
// past it, or one cancelled by its context, makes pgx close the
// connection, and the pool drops it.
// For a connection that stalls, set on the pool's ConnConfig the
// RuntimeParams idle_in_transaction_session_timeout (which ends a stalled
// session on the server and releases its locks) and tcp_keepalives_*,
// and a dialer with TCP keepalive; docs/architecture.md ("Deadlines")
// gives the values. TestStalledConnections stalls every connection of six
// consumers mid-run and checks that each message's effect exists once.
//
// # Lease mode
//
// [idem.LeaseConsumer] claims a message with a lease instead of a
// transaction. Lease-mode records live in the same table, with the columns
// of migration 002: state (1 in_progress, 2 completed, 3 failed, the values
// of [idemdriver.RecordState]), token (the fencing token of the attempt
// owning an in_progress record), attempt, lease_expires_at (timestamptz),
// result (bytea), content_type, last_error and updated_at. A
// transactional claim writes none of them: since migration 006 state,
// token and attempt have no default and a transactional record holds
// NULLs, read everywhere as completed, token 0 and attempt 1 (the values
// that records written before that migration hold), which keeps the row
// narrow;
// recovery points ([idem.Attempt.Step]) go to Table + "_steps", except
// the one that the acquisition of a new record saves
// ([idemdriver.AcquireParams.StepPrefix], token 1), which since migration
// 016 is kept in the record's nullable column point: that acquisition
// writes one row (and its index entries) instead of two, about 300 bytes
// of WAL less per message. Every read of the recovery points (a
// takeover's, [Store.Steps]) reads both, the record's first (it was
// saved first, and a step that exists keeps its first result), and
// Reopen clears both. A Store that found the table before migration 016
// keeps writing every point to Table + "_steps" and still reads those of
// the column. The
// statements are store/idemsql's PostgreSQL ones, so both stores behave the
// same on one table.
//
// The clock is the server's only: a lease is sent as whole microseconds
// (rounded up, so no positive lease becomes zero; a lease that is not
// positive is refused with an error matching [idem.ErrInvalidConfig], field
// lease_expires_at is now() plus the lease, a lease has ended when
// lease_expires_at <= now(), and the remaining lease a loser is told is
// computed by the server in microseconds and returned as a time.Duration
// (one unit end to end). That remaining lease is counted from
// GREATEST(clock_timestamp(), updated_at, processed_at): clock_timestamp()
// is read after the statement's snapshot and after any lock wait, where
// now() (the statement's start) would make a lease granted by a takeover
// that committed in between, or a lease that ran on while the statement
// waited, look longer than it is; the time the lease was set (updated_at,
// which only a renewal sets, else processed_at) bounds it by the
// lease granted even if the server's clock steps back. Go's clock is never
// read.
//
// The statements, each one round trip in pgx's default mode once prepared
// (and in simple protocol mode):
//
//   - [Store.Acquire]: one statement, INSERT ... ON CONFLICT (consumer,
//     message_id) DO UPDATE SET token = token + 1, attempt = attempt + 1,
//     lease_expires_at = now() + lease ... WHERE state = 1 AND
//     lease_expires_at <= now() AND fingerprint = the caller's, RETURNING,
//     in a CTE whose outer SELECT reads the record when the statement did
//     not acquire it (a branch PostgreSQL skips for a new message). ON
//     CONFLICT locks the row and judges the WHERE on its latest version,
//     so of concurrent calls exactly one acquires (tested with 32, on a
//     new message, after an expiry and after a release). When the
//     statement's snapshot misses the record a concurrent caller just
//     committed, or shows an older version than the one the WHERE judged,
//     the statement runs again. A takeover reads its recovery points with a
//     second statement, whose new snapshot sees a step that the previous
//     owner committed while the takeover waited for the row.
//   - [Store.Renew], [Store.Complete], [Store.Release]: one UPDATE each,
//     fenced by WHERE consumer, message_id, state = 1 AND token = the
//     attempt's, judged by rows affected: 0 is an error matching
//     [idem.ErrLeaseLost]. An expired lease that nobody took over is still
//     owned, so a late finisher may complete. Complete sets the state,
//     result (byte for byte, nil as empty) and content type, and keeps the
//     fingerprint. Release ends the lease now, keeps the
//     error text and moves the token on by one, so the released attempt
//     owns nothing; the next attempt's token is one more again (tokens
//     strictly increase; they are not attempt numbers).
//   - [Store.SaveStep]: one statement, INSERT ... SELECT FROM the record
//     locked FOR SHARE while the token owns it ... ON CONFLICT DO NOTHING
//     (the first result of a step is kept), returning whether the token
//     owns the record; a takeover, Complete or Release either waits for
//     the step or is seen by it.
//
// Content types must be valid UTF-8 without NUL bytes, at most
// [MaxContentTypeLength] bytes, and step names 1 to 255 such bytes (errors
// matching idem.ErrInvalidConfig otherwise): PostgreSQL text holds nothing
// else. Error texts are stored with invalid bytes and NULs replaced by
// U+FFFD, cut to [MaxErrorTextLength] bytes. A call whose context has
// ended returns its error (matching context.Canceled or
// context.DeadlineExceeded) and changes nothing.
//
// One consumer name should use one mode. Across modes the table still
// answers consistently: a transactional claim of any existing record, in
// progress or not, is a duplicate; a lease Acquire of a transactional
// record finds it completed, with no result.
//
// # Retention
//
// Retention counts the consumer's running time, not the clock: idem.Purge
// (the core's policy) deletes a record only once its consumer has been
// running for the retention window since the record was written. The store
// keeps the runs in Table + "_runs" (migration 003): [Store.MarkRunning],
// which a running consumer calls as its heartbeat, extends the newest run
// to the server's now() or adds a new one, in one statement.
// [Store.BeginPurge] takes the one-cleaner lock (a transaction-scoped
// advisory lock, held by a transaction of its own that stays open, idle,
// for the purge's length; see "Behind PgBouncer") and returns the session
// that reads the runs and deletes bounded batches, each its own
// transaction on another connection of the pool, oldest first, skipping
// rows locked by others. It never deletes an in_progress lease
// record, however old, and deletes the recovery points of the records it
// deletes in the same statement. [Store.Inspect] and [Store.Stats] serve
// `idem inspect` and `idem stats`.
//
// # Behind PgBouncer
//
// Every operation of the Store (claims, batch claims, BeginClaim's
// pipeline, lease mode, purges, migrations, the outbox and its relay,
// Inspect and Stats) works through PgBouncer in transaction pooling
// (pool_mode = transaction), where a client has a server connection for
// one transaction only. Two things need care:
//
//   - Statements. pgx's default query exec mode, QueryExecModeCacheStatement,
//     prepares a named statement per query on each connection and reuses
//     it, which needs the server session that prepared it. PgBouncer 1.18
//     (Debian 12's) does not carry named prepared statements across server
//     connections; PgBouncer 1.21 and later do, with max_prepared_statements
//     set above 0. Before 1.21, use a mode that prepares no named
//     statement: QueryExecModeCacheDescribe (unnamed statements and a
//     per-connection cache of their descriptions: the same round trips as
//     the default once the cache is warm; restart the pool after changing
//     the type of a column a query reads), QueryExecModeDescribeExec (one
//     more round trip per query) or QueryExecModeSimpleProtocol (text
//     protocol, values interpolated client-side by pgx), in the pool's
//     ConnConfig.DefaultQueryExecMode or in the URL:
//     default_query_exec_mode=cache_describe (also describe_exec, exec,
//     simple_protocol). statement_cache_capacity and
//     description_cache_capacity in the URL size the two caches. The
//     conformance suites run through PgBouncer 1.18 in cache_describe and
//     simple_protocol modes.
//   - Session state. Nothing the Store relies on outlives a transaction:
//     the claim's lock timeout is set with set_config(..., true) (local to
//     the transaction), the migration lock is pg_try_advisory_xact_lock
//     held by a transaction of its own (see Store.Migrate), and the purge
//     lock is
//     pg_try_advisory_xact_lock held by a transaction that spans the purge
//     (a session lock would stay on whichever server connection took it,
//     and its unlock would run on another). That transaction writes
//     nothing and holds no snapshot between statements, so it holds back
//     neither vacuum nor writers; before each batch the purge asks it for
//     the lock again, so if the server or PgBouncer ended it (a dropped
//     client, PgBouncer's idle_transaction_timeout: keep it longer than a
//     purge's longest statement) the purge stops instead of running beside
//     another cleaner. The transaction sets its own
//     idle_in_transaction_session_timeout to one hour (SET LOCAL), so a
//     shorter one meant for handlers does not end it, while a purger that
//     hangs loses its lock. A crashed purger's connection drops, PgBouncer closes the
//     server connection of its open transaction, and the lock is free. A
//     purge uses two connections at once (its lock's and its batches').
//     The one exception is LISTEN (the outbox relay's wake-up): behind
//     PgBouncer it never hears a notification, so set
//     Config.ListenConfig to PostgreSQL itself, or let the relay poll.
//
// The lock considered and not taken is a lock row (owner, expiry) in a
// table, taken and renewed by short transactions: it needs a migration, a
// renewal loop and an expiry that a stalled purger can outlive, and a
// crashed purger blocks others until its expiry, where the transaction's
// lock is released the moment its connection drops. Transaction and
// session advisory locks share one key space, so a process running an
// older idem (pg_try_advisory_lock on the same key) and this one still
// exclude each other.
//
// # Sharing a table
//
// Store/idemsql's PostgreSQL dialect runs the same statements (one source,
// internal/pgsql, shared by both stores), on the same schema, the same
// migrations table and with the same advisory lock keys (FNV-1a 64 of "idem",
// NUL, "migrate" or "purge", NUL, the table name as configured, and for
// purges NUL and the consumer name), so the two stores, and `idem migrate`
// and `idem purge`, can work on one table at once. The keys derive from the
// name as written: "idem_processed" and "public.idem_processed" are one
// table but two keys, so configure every process with the same spelling.
//
// # Times
//
// Every time is the database server's: processed_at defaults to now() (the
// claiming transaction's start), lease expiries are computed from now(),
// remaining leases from clock_timestamp() (see "Lease mode"), and runs
// from now(). Times cross the wire as integer microseconds. The
// application's clock is never written.
//
// # Replication and failover
//
// A record and its effects commit together, so a failover can never run
// an effect twice; it can lose both, after the broker's ack, when the
// primary acknowledged a commit the promoted standby never received: with
// asynchronous standbys, or synchronous_commit off or local. With
// synchronous_standby_names naming the standby and synchronous_commit on
// (or remote_apply) no acknowledged message is lost; docs/failover.md has
// the measured matrix. [Store.FailoverRisk] reads those settings, and
// idem's consumers log one warning at start when they allow a loss.
// Connect with a multi-host URL and target_session_attrs=read-write so
// that the pool follows the primary.
//
// # Testing
//
// The tests run against the PostgreSQL named by IDEM_TEST_POSTGRES_URL
// (e.g. postgres://idem:idem@127.0.0.1:5432/idem_test?sslmode=disable),
// and the PgBouncer tests against the PgBouncer in transaction pooling
// named by IDEM_TEST_PGBOUNCER_URL, in front of it, each on fresh randomly
// named tables, and skip without them unless IDEM_TEST_REQUIRE_ALL=1. The package example runs against that database
// too, and fails (printing why) when the variable is not set.
package idempgxv5

// Package idemdriver is the seam between idem's core and the stores that
// keep its processed-messages records. It is for store authors; an
// application uses the root package idem and a store's constructor, and
// never needs this package except to name a store's type.
//
// The model is database/sql/driver and River's riverdriver: the core owns
// every policy (when a message is a duplicate, how leases and fencing tokens
// are judged, when a record may be purged, how a batch is claimed when a
// store cannot do it in one statement), and a store provides small
// primitives with exactly specified behaviour. A store implements:
//
//   - [TxStore] for transactional mode: Begin, ClaimTx, Commit, Rollback;
//   - [LeaseStore] for lease mode: Acquire, Renew, Complete, Release,
//     SaveStep;
//   - [Retainer] for retention, required by both: MarkRunning and
//     BeginPurge, whose [PurgeSession] deletes one bounded batch at a time.
//
// Optional capabilities are separate interfaces. The core finds
// [BatchClaimer] (claim a batch with one statement), [BeginClaimer]
// (claim pipelined with BEGIN) and [BeginBatchClaimer] (a batch claim
// pipelined with BEGIN) by type assertion, as database/sql finds
// driver.ExecerContext, and where a store lacks one takes a correct, slower
// path (one ClaimTx per message, in byte order of message ID, or Begin then
// ClaimTx or ClaimBatchTx). In lease mode, [StepRecorder] (Acquire saves
// the acquiring attempt's run point and Release a settled point, in the
// same write) spares the at-most-once front ends a SaveStep per message
// (the core saves the points with SaveStep where a store lacks it), and
// [LeaseBatcher] (Acquire and Complete of many records in one commit or
// one pipeline) lets idem consume group the messages it holds, and
// [LeaseBatchRenewer] (many leases renewed in one round trip, fenced per
// lease) lets a LeaseConsumer's renewal scheduler renew thousands of held
// attempts in a few store calls per tick.
// [Migrator] and [Inspector] are for operators' tools, such as the
// idem command's migrate, inspect and stats; [Operator], [OutboxOperator],
// [ConsumerLister], [StepReader] and [Reopener] for its failed, retry,
// release, replay and console (idemtest.RunOperate checks Operator,
// ConsumerLister, StepReader and Reopener; idemtest.RunOutboxOperate,
// OutboxOperator). The
// transactional outbox is [OutboxTx] (write outgoing rows in the
// handler's transaction) and [OutboxStore] (what the relay claims, marks
// and purges), with the optional [OutboxCommitter] (the rows' INSERT sent
// with the COMMIT) and [OutboxNotifier] (PostgreSQL LISTEN/NOTIFY).
// [FailoverRiskReporter] tells, from the server's settings, whether a
// crash or a failover can lose acknowledged writes; the consumers ask it
// once at start and log the answer as a warning.
//
// # Validation
//
// Every exported store method that takes a consumer name, message ID,
// fingerprint, lease or step name checks it with this package's Validate
// functions before it talks to its database, and returns the typed error
// (matching [ErrInvalidConsumerName], [ErrInvalidMessageID],
// [ErrMissingMessageID], [ErrInvalidPayload] or [ErrInvalidConfig]) without
// touching the caller's transaction, which stays usable. The core checks
// the same rules first; the stores check again because they are called
// directly too (by the command, by tests, by other libraries).
//
// # Clocks
//
// Every time a store writes or compares (a record's time, a lease's end,
// a run of the consumer) is taken from the store's own clock: the database
// or Redis server's, never the caller's, so hosts with skewed clocks agree.
//
// # Conformance
//
// A store is correct when it passes the conformance suites of package
// idemtest (idemtest.Run for transactional mode, idemtest.RunLease for
// lease mode), which call both the core and these methods directly.
//
// # Stability
//
// Until idem's first tagged release this interface may change in any
// release. The root package's API is the one kept stable first.
package idemdriver

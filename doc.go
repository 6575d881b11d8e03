// Package idem makes processing a message twice have the effect of
// processing it once: the Idempotent Consumer pattern.
//
// Brokers and relays deliver at least once, so a consumer sees the same
// message again after a crash, an ack timeout or a consumer-group
// rebalance. A [Consumer] records each message's ID in a processed-messages
// table, under a unique key on (consumer name, message ID), in the same
// database transaction as the handler's side effects. A redelivery finds the
// record and is a [Duplicate]: acknowledged, and nothing else happens. A
// handler that fails rolls back its effects and the record together, so the
// redelivery runs it again.
//
// # Modes
//
// That is transactional mode ([Consumer]), for effects in the store's own
// database. Lease mode ([LeaseConsumer]) is for side effects outside it (a
// payment provider, an email): the claim takes a lease with a fencing token,
// renewed while the handler runs, and after a crash a later attempt takes
// over when the lease ends, so an external call may be made again and must
// carry [Attempt.Key]; a message that fails [Config.MaxAttempts] times, or
// with a [Permanent] error, is poison. [LeaseConsumer] says what each mode
// guarantees.
//
// # Identity
//
// The producer gives every message a stable message ID; the consumer never
// makes one up (a message without one is [Rejected] with
// [ErrMissingMessageID]). IDs are compared byte for byte on every store; see
// [ValidateMessageID] for the rules. The consumer name is mandatory, so two
// consumers of one event are deduplicated separately.
//
// # Fingerprints
//
// Each record keeps a fingerprint of the payload ([SHA256Fingerprint] by
// default, [JSONFingerprint] to ignore JSON key order). The same ID with
// another payload is a producer bug: [FingerprintMismatch], checked on every
// path that finds an existing record.
//
// # Stores
//
// A store keeps the processed-messages records. This module has
// [MemoryStore]; store/idempgxv5 (PostgreSQL on pgx v5) and store/idemsql
// (database/sql for PostgreSQL, MariaDB/MySQL and SQLite) serve both modes,
// store/idemredis (Redis) lease mode only. Each is a module of its own, so a
// user of one store downloads no other driver; this module imports only the
// standard library. Store authors implement the interfaces of package
// idemdriver (idemdriver.TxStore, idemdriver.LeaseStore) and pass the
// idemtest conformance suite.
//
// # Coalesced store calls
//
// A LeaseConsumer over a store with batches (idemdriver.LeaseBatcher:
// MemoryStore, store/idemredis, store/idempgxv5, store/idemsql) can
// coalesce the Acquire and Complete calls of its concurrent deliveries,
// as a group commit does: a call made while another is in the store waits for it to
// return and then goes with the others that waited, up to
// [Config.Coalesce], in one AcquireBatch or CompleteBatch: one round
// trip instead of one each. A call made when none is in flight goes out
// at once, alone, as without coalescing. Each delivery keeps its own
// outcome, fencing token and recovery point; see Config.Coalesce for
// errors, deadlines, cancellation and the head-of-line wait behind a
// stalled call. It is on by default ([DefaultCoalesce] 64); 1 turns it
// off.
//
// # Deadlines
//
// Every store call the core makes is bounded by [Config.StoreTimeout] (10s
// by default): a connection that stops answering fails the delivery with
// an error matching [ErrStore] and [ErrStoreTimeout] (redelivered, never
// acked) instead of holding it until the broker's handler timeout. A
// claim waits at most half of it for another transaction that holds the
// same record, by the database's own lock timeout, and is then
// [InProgress] with [ErrLockTimeout]. The handler's work is bounded by the
// caller's context only. docs/architecture.md relates these to the
// broker's ack deadline and the lease, and lists the driver settings
// (TCP keepalive, idle_in_transaction_session_timeout) that end a stalled
// connection and the server session behind it.
//
// # Retention
//
// A processed record is deleted only after its consumer has been running
// for at least the retention window (7 days by default) since the record
// was written. Time in which the consumer was not running does not count,
// whatever new messages arrive after a restart and whichever process runs
// the purge, so the redeliveries of a downtime of any length are still
// duplicates. A running Consumer or LeaseConsumer records its runs in the
// store (at start, then every heartbeat: a tenth of the window, between 1s
// and 1m; a start, or a heartbeat more than three intervals late, begins a
// new run), and [Purge] sums them backwards from the newest to find the
// horizon ([RetentionHorizon]). Records go in bounded batches, one cleaner
// at a time: by [Consumer.Purge], by `idem purge`, or by the background
// loop that [NewConsumer] starts and [Consumer.Close] stops.
//
// # Outbox
//
// A handler that publishes messages emits them with [Emit] (or [EmitFor]
// in a batch handler): they are written to the store's outbox table in the
// handler's transaction, so they commit with its effects and its claim or
// not at all, under IDs derived from the incoming message's ID
// ([OutgoingID]), the same on every reprocessing. A [Relay] sends them
// after commit through a [Publisher] (woken at once by a Consumer whose
// Config.Relay is set), sends whatever a crash left behind, keeps order
// per destination and ordering key, retries a failing destination with
// backoff without holding up the others, and deletes each row once its
// send was confirmed (RelayConfig.KeepSent keeps sent rows for a
// retention instead; failed rows are kept until purged). A duplicate
// delivery never runs the handler and never emits anew; it wakes the
// relay when its first processing left messages unsent. The table's schema
// is documented in docs/outbox.md, so programs in other languages can
// write rows for the relay to send.
//
// # Observing
//
// [Config.Hooks] take values that implement any of the small Hook*
// interfaces, in the style of franz-go's hooks and pgx's tracers: a process
// start that may return a context (for a span the handler's work nests in)
// and its end, each claim, each message's outcome with its
// [DuplicateReason] (completed, in progress, fingerprint mismatch, poison),
// lease renewals, takeovers and losses (a stale completion is a loss at
// "complete"), purges (rows, duration, lag) and store errors, all with the
// consumer name and a latency. A consumer without hooks pays nothing for
// them; a hook's panic is recovered and logged, never changing an outcome.
// See [Hook] for the rules. The idemotel module turns the events into
// OpenTelemetry metrics and spans, and [LogHook] into log/slog records:
// nothing is logged per message above debug level.
//
// A broker adapter puts a [Delivery] in the context of each delivery
// ([WithDelivery]: the broker, the destination, its consumer group and the
// message's headers), and its producer takes a [HeaderInjector]: that is
// how a tracing hook continues the producer's trace across the broker
// without idem or the adapters depending on a tracing library.
package idem

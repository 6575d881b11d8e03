// Package idemredisstream runs Redis Streams entries through an idem
// Idempotent Consumer, on github.com/redis/go-redis/v9, with consumer
// groups.
//
// A [Consumer] is one member of a consumer group. It reads new entries with
// XREADGROUP (COUNT and BLOCK), takes each entry's message ID from a field
// (message-id by default) and its payload from another
// (payload by default), passes them to an [idem.Processor] (made with
// idem.Bind or idem.BindLease), and settles the entry as
// [idem.Outcome.Settle] decides, for every idem adapter alike; on Redis
// Streams that is:
//
//   - Processed, Duplicate: XACK.
//   - InProgress (lease mode: another attempt holds a live lease) and
//     Failed, not poison (a Processor that panics counts as Failed, with an
//     idem.PanicError): the entry is left pending, and is reclaimed by
//     XAUTOCLAIM (by this member or another) after Outcome.RetryAfter or
//     Config.RetryDelay; see below.
//   - Rejected (no or invalid message ID, unreadable payload),
//     FingerprintMismatch, poison, and Failed with an error marked
//     idem.Permanent: XADD to the dead-letter stream with
//     the original fields plus the fields every idem adapter writes
//     (Idem-Dead-Letter-Reason, a stable word such as "invalid-message-id";
//     Idem-Dead-Letter-Error, the Outcome's error text;
//     Idem-Dead-Letter-Status; Idem-Original-Message-Id) and
//     Idem-Original-Stream and Idem-Original-Entry, and XACK, in one Lua script
//     (EVALSHA) that acks only once the XADD succeeded: the dead letter and
//     the ack happen together or not at all (MULTI/EXEC would not do: EXEC
//     runs the XACK even when the XADD fails, as on a dead-letter key of
//     another type). If it fails the entry stays pending and is reclaimed
//     later. An entry without the payload field is Rejected with
//     idem.ErrInvalidPayload, never processed with an empty payload.
//     Nothing is dropped silently and nothing that failed is acked as done.
//
// # Pending entries and XAUTOCLAIM
//
// An entry read by a member stays in the group's pending entries list
// until XACK. Every member runs an XAUTOCLAIM loop (every
// Config.ClaimInterval) that claims entries idle longer than
// Config.MinIdle, from any member: this is how the entries of a member that
// crashed, lost its connection or was shut down are redelivered. A member
// keeps its own entries in flight alive: every MinIdle/3 it resets their
// idle time (XCLAIM ... JUSTID, which does not count a delivery), so a
// handler that runs longer than MinIdle is not handed to a second member
// while it runs, a graceful Stop included. It stops doing so when it
// crashes, and after Config.HandlerTimeout (5 minutes by default): the
// handler's context ends then, so a handler blocked on a stalled
// connection gives up and its entry is redelivered, and one that ignores
// its context no longer holds its entry, which XAUTOCLAIM hands out again
// after MinIdle while it still runs (idem's record makes the two runs
// safe: the second waits for the first's transaction, or is InProgress in
// lease mode).
//
// An entry deleted from the stream while it is pending (XDEL, or trimming:
// XTRIM, XADD MAXLEN, ProducerConfig.MaxLen) cannot be redelivered: Redis 7's
// XAUTOCLAIM removes it from the pending entries list and go-redis does not
// report it, so it is neither processed nor dead-lettered. Trim only
// entries every group has acknowledged.
//
// Nothing is read ahead: XREADGROUP and XAUTOCLAIM ask for no more entries
// than there are free workers (COUNT), and an entry read is handed to a
// worker at once and kept alive from then on, so no entry waits, idle and
// unreported, for its turn while XAUTOCLAIM's min-idle runs out, however
// slow the store.
//
// A delayed redelivery uses the same mechanism. To redeliver an entry after
// a delay d shorter than MinIdle, the Consumer sets the entry's idle time to
// MinIdle-d (XCLAIM ... IDLE, JUSTID), so XAUTOCLAIM claims it d later; a
// delay of MinIdle or more is redelivered after MinIdle. The delay is
// therefore precise to about ClaimInterval.
//
// # Batch mode
//
// With Config.BatchProcessor instead of Processor, the entries one
// XREADGROUP returns, and those one XAUTOCLAIM reclaims, at most
// Config.BatchSize of them (COUNT), go to one ProcessBatch call through
// idem.GuardBatch, with each entry's fields in the idem.Delivery's
// BatchHeaders; each entry is then settled by its own Outcome exactly as
// above (the acks of a batch in one XACK, each dead letter and delayed
// redelivery on its own). Concurrency is then the number of batches
// processed at once: a batch is read when a worker is free, so at most
// Concurrency*BatchSize entries are held, and nothing is read ahead.
// The entries of a batch are kept alive while the call runs, and
// HandlerTimeout bounds the whole call. An idemhttp.Deliverer is such a
// processor in lease mode (a batch's claims in one store call, its
// results in another), idem.BindBatch in transactional mode (one
// transaction per batch). Two entries of one batch with the same message
// ID are judged in order: in lease mode the second finds the first's
// lease and is InProgress, redelivered later as a Duplicate.
//
// # Delivery limit
//
// In transactional mode a handler that always fails would be retried for
// ever: the claim rolls back with the effects, so the store counts no
// attempts (lease mode counts them and poisons the message after
// MaxAttempts; in either mode a handler error wrapped with idem.Permanent
// is dead-lettered at once). Config.MaxDeliveries bounds that from the
// broker's side: an entry that XAUTOCLAIM reclaims after it was delivered
// more than MaxDeliveries times (its XPENDING delivery count) is
// dead-lettered with idem.ErrTooManyDeliveries (reason
// "too-many-deliveries") instead of being processed again. A reclaim of an
// entry found InProgress counts as a delivery too, so set it well above the
// number of retries a lease may take.
//
// # Stopping
//
// [Consumer.Stop] stops gracefully: no new XREADGROUP or XAUTOCLAIM,
// the entries already read are processed and settled, then Run returns
// nil.
// It waits at most one BLOCK period (Config.Block) for the read in
// progress. Cancelling Run's context instead stops at once: handlers'
// contexts are cancelled, whatever was not settled stays pending for
// XAUTOCLAIM, and Run returns ctx.Err().
//
// # Redis Cluster
//
// The dead letter and the ack run in one script, which Redis Cluster
// allows only for keys of one hash slot: give the stream and its dead
// letter a common hash tag, such as {orders} and {orders}:dead.
//
// # Producing
//
// [Producer.Publish] appends an entry (XADD) with the message ID field set
// to a UUIDv7 by default, or the caller's business key ([WithMessageID]),
// so a publish retried after an unknown outcome carries the same ID and the
// consumer deduplicates it.
//
// # Server versions
//
// Supported: Redis 7.0 and later (Debian 12 ships 7.0.15, which
// scripts/services runs and the broker conformance suite, broker/brokertest,
// is run against); later releases keep the semantics of the stream commands
// used. Redis 6.2 has XAUTOCLAIM but returns entries deleted while pending
// instead of dropping them (see above), and is not supported. A dead letter
// is final: its XADD and the original's XACK run in one script, and an
// acknowledged entry leaves the pending entries list, the only place
// XAUTOCLAIM reclaims from.
package idemredisstream

// Package idemwatermill makes any Watermill handler
// (github.com/ThreeDotsLabs/watermill, message.Router) an idem Idempotent
// Consumer, on any Pub/Sub and with any idem store: a
// message.HandlerMiddleware that claims the message ID in the store before
// the handler runs and acknowledges a redelivery as a duplicate without
// running it again.
//
// Watermill's own middleware.Deduplicator keeps the IDs it has seen in the
// memory of one process, for a time window, and records an ID before the
// handler runs: a restart or a second replica forgets them, and a handler
// that fails has its message counted as seen. Here the record is the
// store's, shared by every replica and kept across restarts, and it exists
// only once the handler has succeeded.
//
// # Modes
//
// [Transactional] (an *idem.Consumer, transactional mode) is for handlers
// whose effects live in the store's database, the way Watermill's SQL
// users work: the middleware begins a transaction, claims the ID in it,
// and calls the handler with the transaction in msg.Context() ([Tx] reads
// it: a *sql.Tx with store/idemsql, a pgx.Tx with store/idempgxv5). The
// handler writes its rows, and can publish its output with a Watermill SQL
// Publisher on the same transaction; claim, rows and output commit or roll
// back together. A concurrent delivery of the same message waits for the
// first transaction and is then a duplicate: the effects commit exactly
// once.
//
// [TransactionalIn] goes one step further where the Pub/Sub itself
// consumes in a transaction of the same database, as watermill-sql's
// subscriber does (its sql.TxFromContext): the claim and the effects join
// that transaction, which the Pub/Sub commits with its ack (each message
// under a savepoint, so that a failed handler is undone before the nack).
// Claim, effects and ack are then one commit: a crash leaves all of them
// or none.
//
// [Lease] (an *idem.LeaseConsumer, lease mode) is for handlers whose
// effects are elsewhere (an HTTP API, a payment provider): the attempt
// holds a lease with a fencing token, read with [Attempt] from
// msg.Context(); a handler error releases it for a retry, and MaxAttempts
// failures poison the message. The messages the handler returns are stored
// with the record and returned to duplicates, so a crash between the
// completion and the Router's publish does not lose them.
//
// Add the middleware to the handler it protects (Handler.AddMiddleware):
// the Consumer's Name is that handler's consumer name, and two handlers of
// the same messages need two Consumers.
//
// # Message ID
//
// The ID is the message's UUID (message.Message.UUID) by default: a
// Watermill Pub/Sub carries it from publisher to subscriber (watermill-sql
// and watermill-amqp do), so the same message published twice, or
// redelivered, has the same ID. Config.IDKey names a metadata key to read
// instead (a business key the producer writes). A message without an ID
// (an empty UUID or key) is Rejected: the middleware returns an [*Error]
// matching idem.ErrMissingMessageID, and is never acknowledged as done.
//
// # What the Router does with each outcome
//
// Watermill acks a message whose handler returned nil (after publishing
// the messages it returned) and nacks it otherwise; the middleware maps
// each idem.Outcome, through idem.Outcome.Settle as every idem adapter
// does, to that:
//
//   - Processed: the handler's messages and nil, so the Router publishes
//     them and acks.
//   - Duplicate: nil (lease mode: the stored messages), acked without
//     calling the handler.
//   - Failed, not poison (the handler returned an error or panicked; the
//     claim rolled back), and InProgress (another delivery holds the
//     lease or the row lock): after a wait (Config.RetryDelay, or what is
//     left of the other delivery's lease), an *Error with Action
//     idem.Redeliver: the Router nacks and the Pub/Sub redelivers.
//   - Rejected (no or an invalid ID), FingerprintMismatch (the same ID
//     with another payload), poison (MaxAttempts in lease mode, an error
//     wrapped with idem.Permanent): an *Error with Action idem.DeadLetter,
//     at once, with idem's dead-letter keys (idem.HeaderDeadLetterReason,
//     ...) set in the message's metadata. [ShouldDeadLetter] recognises it:
//     give it to Watermill's middleware.PoisonQueueWithFilter, added
//     before this middleware, to move these messages to a poison topic and
//     ack them there. Without a poison queue they are nacked, and
//     redelivered, for ever: nothing is dropped silently.
//
// Watermill's middleware.Retry may wrap this middleware (each retry claims
// again). A middleware.Timeout, outside or inside it, bounds the handler:
// its context ends, its statements fail, and the claim rolls back with
// them.
//
// # Costs
//
// One store transaction per message (transactional mode: BEGIN, the claim,
// COMMIT, in the same database as the effects) or a lease acquire and a
// complete (lease mode), instead of the Deduplicator's map lookup.
// BenchmarkMiddleware, in this module's test module, measures it against
// the Deduplicator, one message at a time, with the handler writing the
// same row on durable PostgreSQL: about 1.4 to 1.7 times its time per
// message, 3.5 times its client CPU, 690 WAL bytes against 152 and 93
// allocations against 16 (the README's table has the runs). A redelivery that is a duplicate costs one claim. In
// transactional mode, the messages a handler returns (rather than publishing
// them on the transaction) are published after the commit, and a crash
// between the two loses them.
package idemwatermill

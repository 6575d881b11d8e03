// Package idemamqp runs RabbitMQ deliveries through an idem Idempotent
// Consumer, on github.com/rabbitmq/amqp091-go.
//
// A [Consumer] consumes one queue with manual acknowledgements and a
// prefetch, reads each delivery's message ID from the message_id property
// (or a header), passes it to an [idem.Processor] (made with idem.Bind or
// idem.BindLease), and settles the delivery as [idem.Outcome.Settle]
// decides, for every idem adapter alike; on RabbitMQ that is:
//
//   - Processed, Duplicate: basic.ack.
//   - InProgress (lease mode: another attempt holds a live lease): the
//     delivery is held for Outcome.RetryAfter, then nacked with requeue.
//   - Failed, not poison (the handler or store failed; the claim was rolled
//     back; or the Processor itself panicked, recovered as an
//     idem.PanicError): held for Config.RetryDelay, then nacked with
//     requeue.
//   - Rejected (no or invalid message ID, unreadable payload),
//     FingerprintMismatch, poison, and Failed with an error marked
//     idem.Permanent: published to the dead-letter queue
//     with publisher confirms, carrying the original body and properties
//     plus the headers every idem adapter writes (Idem-Dead-Letter-Reason,
//     a stable word such as "invalid-message-id"; Idem-Dead-Letter-Error,
//     the Outcome's error text; Idem-Dead-Letter-Status;
//     Idem-Original-Message-Id) and Idem-Original-Queue, then acked. A dead letter that cannot be
//     published (no confirm, unroutable, channel lost) is not acked: the
//     delivery is requeued after RetryDelay. Nothing is dropped silently and
//     nothing that failed is acked as done.
//
// # Delayed redelivery
//
// RabbitMQ has no delayed nack. The Consumer holds an InProgress or Failed
// delivery, unacknowledged, for the delay and then nacks it with requeue, so
// that it goes back to the head of the queue for any consumer. A held
// delivery occupies one slot of the channel's prefetch (Config.Prefetch) but
// no worker: while deliveries are held the Consumer takes fewer new ones,
// which is the back-pressure wanted when a message is in progress elsewhere
// or the store is failing. Raise Prefetch above Concurrency to keep workers
// busy while some deliveries wait. If the channel or connection is lost
// meanwhile, RabbitMQ requeues the held deliveries itself; Stop nacks them
// with requeue at once. (The alternative, a delay queue with a message TTL
// and a dead-letter exchange back to the queue, needs topology the
// Consumer would have to own, and reorders the queue; it is not used.)
//
// # Prefetch and ack deadlines
//
// RabbitMQ has no per-delivery ack deadline: a delivery stays with its
// consumer, unacknowledged, until it is settled or the channel closes, so
// deliveries prefetched ahead of the workers (Config.Prefetch above
// Concurrency) are never redelivered while they wait their turn, however
// slow the store. The one bound is the broker's consumer_timeout (30
// minutes by default in RabbitMQ 3.10 and 4.x): a delivery left
// unacknowledged longer makes the broker close the channel, requeueing every
// delivery on it; the Consumer then opens a new channel and the requeued
// deliveries come back (Duplicates where they were processed). Keep
// Prefetch times the slowest handler run, plus RetryDelay for held
// deliveries, well below it.
//
// # Connections and reconnection
//
// The Consumer takes the caller's *amqp.Connection and opens its own two
// channels on it: one to consume, one in confirm mode for dead letters.
// When a channel is closed by the server (a channel-level exception) the
// Consumer opens new ones on the same connection. When the connection
// itself closes (network loss, broker restart, a forced close), RabbitMQ
// requeues every delivery the Consumer had not acknowledged, and the
// Consumer calls Config.Redial, with exponential backoff between failed
// calls (cenkalti/backoff/v5), to get a new connection; the connections it
// gets from Redial are its own and it closes them when Run returns. Without
// Redial, a lost connection ends Run with an error matching
// [ErrConnectionClosed]. Deliveries of a lost channel are never acked on a
// later one: each delivery is settled on the channel it came from, so a
// stale delivery tag can never acknowledge another message.
//
// amqp091-go's experimental automatic recovery (amqp.Config.Recovery) is
// refused with [idem.ErrInvalidConfig]: it reopens channels under the same
// *amqp.Channel value, so an ack of a delivery from before the recovery
// would carry a stale tag to the new channel and could acknowledge a
// message that was never processed.
//
// # Stopping
//
// [Consumer.Stop] stops gracefully: basic.cancel so that no new delivery
// arrives, deliveries already prefetched but not started are nacked with
// requeue, the ones in flight finish and are settled, held ones are nacked
// with requeue, then the channels close. Cancelling Run's context instead
// stops at once: handlers' contexts are cancelled and the channels close,
// so RabbitMQ requeues whatever was not settled. Run returns nil after
// Stop, and ctx.Err() when its context ended first.
//
// # Producing
//
// [Producer.Publish] publishes a persistent message with publisher
// confirms and a stable message ID in the message_id property: a UUIDv7 by
// default, or the caller's business key ([WithMessageID]), so a publish
// retried after a lost confirm carries the same ID and the consumer
// deduplicates it. With [ProducerConfig].Redial, a Publish after the
// connection closed (a broker restart) first gets a new one, with the same
// backoff as the Consumer; a publish whose connection went while it waited
// for its confirm returns an error, and the caller publishes again with the
// same ID.
//
// # Poison in transactional mode
//
// In transactional mode a handler that always fails is redelivered for
// ever (every RetryDelay): the claim rolls back with the effects, so there
// is no attempt count in the store. Lease mode counts attempts and turns
// the last failure into a poison outcome, which is dead-lettered. In
// either mode a handler error wrapped with idem.Permanent is dead-lettered
// at once. A quorum queue's delivery-limit is the broker-side bound for
// the transactional case. RabbitMQ 4.0 gives quorum queues a delivery-limit
// of 20 by default: a message returned to the queue that many times is
// dropped by the broker, or dead-lettered by the queue's own dead-letter
// exchange, not by idem; leave room in it for the retries a lease may take.
//
// # Server versions
//
// The Consumer and Producer use AMQP 0-9-1 only (basic.qos, basic.consume,
// basic.ack, basic.nack with requeue, publisher confirms, mandatory
// publishes), on classic and quorum queues, and need no plugin. Supported:
// RabbitMQ 3.10 (Debian 12 ships 3.10.8, which scripts/services runs and
// the broker conformance suite, broker/brokertest, is run against) through
// the current 4.x, where those methods are unchanged. A dead letter is
// final on each: the original is acked with basic.ack only after the dead
// letter's publisher confirm, and an acked delivery is never redelivered.
package idemamqp

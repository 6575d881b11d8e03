// Package idemgocdk runs messages received through the Go CDK's portable
// pub/sub API (gocloud.dev/pubsub) through an idem Idempotent Consumer:
// one adapter for every service the Go CDK reaches (Google Cloud Pub/Sub,
// AWS SQS and SNS, Azure Service Bus, NATS, Kafka, RabbitMQ, and mempubsub
// in memory).
//
// The broker's own durability is the driver's and the service's: idem
// cannot keep a message the broker lost before delivering it. Measured
// here under SIGKILL of RabbitMQ: the Go CDK's rabbitpubsub driver
// publishes transient messages, and a killed RabbitMQ lost a message it
// had confirmed on a classic queue; declare the queue as a quorum queue
// (or durable with persistent messages by other means) where a broker
// crash must not lose messages.
//
// A [Consumer] takes the caller's *pubsub.Subscription, opened with any
// driver, and imports no driver itself: the driver, and its dependencies,
// are the application's choice. It calls Receive only when one of its
// Config.Concurrency workers is free, reads each message's ID from the
// metadata key Config.IDKey ("Idem-Message-Id" by default, written by
// [Producer]) or from Config.MessageID ([DriverMessageID] takes the
// driver's own ID), passes the message to an [idem.Processor] (made with
// idem.Bind or idem.BindLease) through idem.Guard, and settles it as
// [idem.Outcome.Settle] decides, for every idem adapter alike; on the Go
// CDK that is:
//
//   - Processed, Duplicate: Message.Ack, only once the claim's transaction
//     (transactional mode) or the attempt (lease mode) has committed. The
//     Go CDK sends acks in the background, batched: a crash right after
//     the commit loses the ack, and the redelivery is a Duplicate.
//   - InProgress (lease mode: another attempt holds a live lease) and
//     Failed, not poison (a Processor that panics counts as Failed, with an
//     idem.PanicError): Message.Nack after Outcome.RetryAfter or
//     Config.RetryDelay, on a driver that can nack (Message.Nackable:
//     Pub/Sub, SQS, mempubsub, ...). The Go CDK has no nack with a delay,
//     so the Consumer holds the message (not a worker) until the delay has
//     passed; a delay longer than the subscription's ack deadline is cut
//     short by the deadline. On a driver that cannot nack, the message is
//     neither acked nor nacked and the service redelivers it when its ack
//     deadline lapses.
//   - Rejected (no message ID: idem.ErrMissingMessageID; an invalid one:
//     idem.ErrInvalidMessageID), FingerprintMismatch, poison, and Failed with
//     an error marked idem.Permanent: Send to Config.DeadLetter (a
//     *pubsub.Topic) with the original body and metadata plus the keys
//     every idem adapter writes (Idem-Dead-Letter-Reason, a stable word such
//     as "missing-message-id"; Idem-Dead-Letter-Error, the Outcome's error
//     text; Idem-Dead-Letter-Status; Idem-Original-Message-Id) and
//     Idem-Original-Loggable-Id (the driver's ID of the original), and then
//     Ack. Topic.Send returns once the driver has the dead letter; if it
//     fails the original is not acked but redelivered. Nothing is dropped
//     silently and nothing that failed is acked as done.
//
// # Ack deadlines
//
// The Go CDK does not extend ack deadlines: a message whose handler runs
// longer than the subscription's ack deadline (Pub/Sub's
// ackDeadlineSeconds, SQS's visibility timeout) is delivered again while it
// runs. idem makes that redelivery safe (it waits on the claim's row lock
// in transactional mode, or is InProgress in lease mode and nacked after
// the lease's remaining time), but it costs a delivery: set the deadline
// above the longest handler.
//
// The Subscription fetches ahead of Receive by itself, sizing its batches
// to hold about two seconds of messages; messages waiting in its queue age
// toward their ack deadline. Where handlers are slow, bound it with the
// driver's ReceiveBatcherOptions (MaxBatchSize near Config.Concurrency;
// MaxBatchSize 1 and MaxHandlers 1 fetch one message at a time).
//
// # Delivery limit
//
// In transactional mode a handler that always fails is retried for ever:
// the claim rolls back with the effects, so the store counts no attempts
// (lease mode counts them and poisons the message after MaxAttempts; in
// either mode a handler error wrapped with idem.Permanent is dead-lettered
// at once). The Go CDK has no portable delivery count, so this adapter
// sets no limit of its own: give the subscription the service's limit
// (a Pub/Sub dead-letter policy with max_delivery_attempts, an SQS redrive
// policy with maxReceiveCount), which moves such a message aside without
// idem's dead-letter metadata.
//
// # Stopping
//
// [Consumer.Stop] stops gracefully: no new Receive, the messages already
// received are processed and settled, messages waiting for a delayed nack
// are nacked at once, then Run returns nil. Cancelling Run's context
// instead stops at once: handlers' contexts are cancelled and what was not
// settled is redelivered after its ack deadline. Shut the Subscription
// down after Stop: that flushes the acks the Go CDK still holds.
//
// The Go CDK (v0.49.0) fetches in a goroutine of its own, started by
// Receive. When Stop interrupts a Receive whose fetch then brings
// messages, that goroutine waits for the Subscription's next Receive, even
// through Shutdown, and the messages it fetched are redelivered after their
// ack deadline. A process that stops consuming for good loses nothing by
// it; one that runs a new Consumer on the same Subscription hands it those
// messages.
//
// # Producing
//
// [Producer.Send] sends a message with the message ID in its metadata, the
// caller's business key or else a UUIDv7 (kept when the same message is
// sent again), so a send retried after an unknown outcome carries the same
// ID and the consumer deduplicates it. A driver's own message ID is assigned per send
// and cannot do that. Keep metadata small where the service limits it
// (SQS carries at most 10 message attributes, and a dead letter adds 5
// keys to the original's).
package idemgocdk

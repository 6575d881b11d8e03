// Package idemnats is idem's NATS JetStream adapter, on nats.go's jetstream
// package: a Consumer that runs every delivery of a pull consumer through an
// idem.Processor and maps its Outcome to JetStream, and a Producer that
// publishes with a stable message ID.
//
// It takes the caller's jetstream.JetStream and jetstream.Consumer: the
// application owns the connection, the stream and the consumer's
// configuration (AckWait, MaxAckPending, filters); idemnats parses no URLs.
//
// # Message IDs
//
// The message ID is read from the Nats-Msg-Id header (Config.IDHeader to
// change it; NATS header names are case-sensitive), the header JetStream
// itself deduplicates publishes by within the stream's duplicate window
// (StreamConfig.Duplicates, 2 minutes by default). Producer.Publish sets it:
// a new UUIDv7 by default, or a business key with WithMessageID, and
// publishes with jetstream.WithMsgID, so a producer's retry within the window
// is dropped by the server and one after it is a Duplicate for idem. A
// message without the header is passed on with an empty ID, rejected by
// idem (idem.ErrMissingMessageID) and dead-lettered; the consumer never makes
// up an ID. A message whose header has two different values has no single
// identity: it is dead-lettered as Rejected (idem.ErrInvalidMessageID)
// without calling the Processor. NATS trims the spaces around header
// values, so Producer.Publish refuses an ID with a leading or trailing
// space rather than publish another ID than the one it returns.
//
// # Outcomes
//
// Each delivery is settled as [idem.Outcome.Settle] decides, for every idem
// adapter alike; on JetStream that is:
//
//   - Processed, Duplicate: Ack.
//   - InProgress (lease mode: another attempt holds the lease):
//     NakWithDelay(Outcome.RetryAfter).
//   - Failed, retryable (the handler's error, a store error, a panic, an
//     Outcome without a Status): NakWithDelay(Config.RetryDelay).
//   - Rejected (missing or invalid ID, invalid payload), FingerprintMismatch,
//     and poison (a Failed Outcome with Poison set): the payload and headers
//     (minus JetStream's Nats-* headers) are published with JetStream to
//     Config.DeadLetter with the headers every idem adapter writes
//     (Idem-Dead-Letter-Reason, a stable word such as "invalid-message-id";
//     Idem-Dead-Letter-Error, the Outcome's error text;
//     Idem-Dead-Letter-Status; Idem-Original-Message-Id) and
//     Idem-Original-Subject, Idem-Original-Stream and Idem-Original-Sequence,
//     and once the server has stored it the original is terminated (plain
//     AckTerm: done, never redelivered; see Server versions). If the
//     dead-letter publish fails (no stream captures the subject, a timeout)
//     the original is Nak'ed for redelivery, never dropped.
//
// A dead letter's own Nats-Msg-Id is derived from the original's stream,
// consumer and sequence, so a crash between the publish and the Term does
// not store it twice within the duplicate window.
//
// # Ack timeouts
//
// JetStream redelivers a message not acknowledged within the consumer's
// AckWait. While a handler runs, the Consumer reports the delivery in
// progress (AckProgress) every Config.ProgressInterval, a third of AckWait by
// default, so a long handler is not redelivered to another member; a member
// that dies stops reporting, and its messages come back after AckWait.
// With ProgressInterval negative, a handler that outlives AckWait gets its
// message redelivered while it runs; idem then makes the redelivery wait
// for the first transaction and see a Duplicate (transactional mode), or
// answers InProgress, which becomes NakWithDelay (lease mode).
//
// Leave the consumer's MaxDeliver at -1 (unlimited, the default) or high
// enough for InProgress and Failed redeliveries: idem's own MaxAttempts
// (lease mode) is what should turn a failing message into a dead letter.
// JetStream drops a message after its MaxDeliver-th delivery; so that it
// is not lost unseen, a delivery that reaches MaxDeliver (as the consumer's
// info said at NewConsumer) and is not acknowledged is dead-lettered with
// reason "too-many-deliveries" (idem.ErrTooManyDeliveries, wrapping its
// last outcome's error), and a message buffered at Stop on its
// last delivery is processed rather than Nak'ed.
//
// The Consumer must not receive its own dead letters (they carry a new
// Nats-Msg-Id, so a refused message would come back and be processed):
// NewConsumer refuses a DeadLetter subject matched by the consumer's
// filter subjects, and Run one captured by its stream when it has no
// filter, with errors matching idem.ErrInvalidConfig.
//
// # Concurrency, fetching ahead and stopping
//
// Run pulls with jetstream.Consumer.Fetch, one pull request at a time,
// each for as many messages as the Consumer has room for, and processes up
// to Config.Concurrency messages at once. (Not with Consumer.Consume or
// Consumer.Messages: they renew their pull from a count of pending
// messages that a message arriving while the previous pull request is
// still being sent leaves at zero, with no request out, so that consuming
// stalled until a missing heartbeat, 30s later; and Messages' channel,
// sized to the pull, dropped a delivery after a reconnect.) A reconnect
// sends a new pull request at once. A pull request waits at the
// consumer's leader; when that node dies, nothing but the heartbeats the
// request asked for, which stop, tells the client (the new leader may take
// the request over, but not always), and a request sent while the consumer
// has no leader is dropped without an answer. Each request asks for a
// heartbeat every second, and after two missed the next request goes
// out, so that consuming resumes within about two seconds of the new
// leader's election. (With nats.go's default for a 30-second request,
// 5-second heartbeats, each lost request cost 10 seconds, and one sent
// during an election that outlasted them, 10 more.) A connection that
// stops answering without closing (half-open TCP, a dropped route) is
// the caller's to detect: the heartbeats end each request, but the next
// ones go into the same connection until nats.go's pings give it up,
// two minutes apart by default. Connect with nats.PingInterval (idem
// consume and idem relay use 2s with nats.MaxPingsOutstanding(2)):
// consuming on a black-holed connection resumed after 6 minutes with the
// defaults, after 5 seconds with 1-second pings. The
// Consumer holds up to
// Config.MaxMessages (twice Concurrency by default): a message's ack wait
// runs from its delivery, so the ones waiting for a free handler are
// reported in progress (AckProgress) every third of AckWait
// (Config.ProgressInterval when positive) while they wait, and do not come
// back to another member, or to this one, while they wait their turn.
// (With a slow store, say 35ms a claim, one handler and 32 messages
// fetched ahead, the last of them would otherwise wait past a 1s AckWait
// and be redelivered, and the redeliveries, buffered behind the others,
// would expire in turn.) Nothing waits in the client's own buffer, out of
// reach of those reports. The messages whose handler runs are reported
// too, at the same period, by the same goroutine: one ticker per
// Consumer, not one per message, however many it holds. So a short
// AckWait (a few seconds) brings a dead member's messages back soon
// without taking a slow handler's message away from a live one. Several Consumers, in one process or many, on
// the same durable consumer share its messages. Stop is graceful: no new
// pull requests; the messages held but not started are Nak'ed so that
// another member gets them at once, as are those that reach the pull
// request still out until 100ms pass without one (it is then cancelled,
// and a message the server sends it later waits out AckWait);
// handlers in flight finish with their context intact, their acks are
// flushed to the server, then Run returns nil. When Run's context ends
// instead, Run returns ctx.Err(). Stop's context bounds the wait; when it
// ends, the handlers still running are cancelled.
//
// # Batch mode
//
// With Config.BatchProcessor instead of Processor, the messages of one
// pull request that reach the Consumer together (every one the client
// has received when it takes one) go to one ProcessBatch call, through
// idem.GuardBatch, and each is settled by its own Outcome. Concurrency is
// then the number of batches processed at once, and a batch holds at most
// MaxMessages/Concurrency messages (batches waiting for a handler are
// joined up to that many). A batch is reported in progress while it
// runs, as a message is, and HandlerTimeout bounds the whole call. An
// idemhttp.Deliverer is such a processor in lease mode (a batch's claims
// in one store call, its results in another), idem.BindBatch in
// transactional mode (one transaction per batch).
//
// Retention: keep idem's RetentionWindow longer than the stream's MaxAge
// (or the longest time a message can wait for redelivery); idemnats does
// not check this, since the Processor hides the idem.Config.
//
// # Server versions
//
// Supported: nats-server 2.9 (Debian 12 ships 2.9.10) through the current
// 2.x (2.15, the in-process server of the tests); the package passes the
// broker conformance suite (broker/brokertest) against both. A dead
// letter's original is settled with a plain AckTerm rather than
// jetstream.Msg.TermWithReason: servers before 2.10 take only the exact
// "+TERM" and ignore "+TERM <reason>", so the original would be
// redelivered after every AckWait and dead-lettered again, once per
// duplicate window, for ever. Choosing the form by the connected server's
// version would not do either: in a cluster being upgraded the consumer's
// leader, which takes the ack, may run another version than the server the
// client is connected to. The reason is in the dead letter's headers; the
// server's termination advisory (2.10 and later) then carries none.
package idemnats

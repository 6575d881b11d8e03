// Package idemkafka runs the records of a Kafka consumer group through an
// Idempotent Consumer (package idem), on franz-go's kgo client.
//
// Kafka delivers at least once: after a crash or a consumer-group rebalance,
// a partition is read again from its last committed offset, and the records
// the previous owner processed but had not committed are delivered again.
// idem records each message ID with the handler's side effects in one
// transaction, so such a replay is a Duplicate: its offset is committed and
// nothing else happens (the seed's decision record: "consumer rebalancing
// causes invoice events to be processed more than once").
//
//	cl, err := kgo.NewClient(append([]kgo.Opt{
//		kgo.SeedBrokers("localhost:9092"),
//		kgo.ConsumerGroup("billing"),
//		kgo.ConsumeTopics("invoices"),
//	}, idemkafka.ClientOpts()...)...)
//	c, err := idemkafka.NewConsumer(cl, idemkafka.Config{
//		Processor:  idem.Bind(consumer, createInvoice),
//		DeadLetter: "invoices-dead",
//	})
//	go c.Run(ctx)
//	...
//	err = c.Stop(ctx) // finish in-flight records, commit
//	cl.Close()        // leave the group
//
// # The client
//
// The Consumer takes the caller's *kgo.Client, as every idem adapter takes
// its broker's client: the caller chooses seeds, TLS, SASL, topics, group,
// balancers, session timeouts. The client must be a consumer group client
// built with [ClientOpts] appended: kgo.DisableAutoCommit (the Consumer
// commits), kgo.BlockRebalanceOnPoll (no revocation between a poll and the
// hand-over of its records), and the OnPartitionsRevoked / OnPartitionsLost
// callbacks that let the Consumer commit on revocation. Because kgo calls
// those callbacks with the client, the options are plain package-level
// values (like kgo's own) and the Consumer is attached to the client by
// [NewConsumer], which checks that the options are there.
//
// # The message ID
//
// The ID is the value of a record header, "message-id" by default
// (Config.IDHeader), compared byte for byte. The
// record key is not the ID: keys pick partitions and are shared by every
// event of one entity. A record without the header is passed to the
// Processor with ID "" and comes back Rejected with idem.ErrMissingMessageID;
// a header repeated with different values is Rejected with
// idem.ErrInvalidMessageID. Both are dead-lettered. [Producer.Publish] sets
// the header: a UUIDv7, or the caller's business key with [WithMessageID].
//
// # Offsets
//
// Each partition's records are processed in offset order (by default; see
// "Key order" for the order by record key). A record is done
// when its Outcome is acknowledged (Processed, Duplicate) or when it was
// written to the dead letter. The offset committed for a partition is the
// one after the longest run of done records from the last commit: a later
// record done before an earlier one (batch mode, key order) never commits past the
// earlier, so a record that is not done is never skipped by a commit. Gaps
// in offset numbers (compaction, transaction markers) do not matter; the run
// is counted in records received. Offsets are committed right after records
// are done, one commit at a time (signals arriving during a commit are
// folded into the next one), with the leader epoch of the last record.
// A commit therefore always follows the commit of the records'
// transactions: a crash in between replays those records, which are then
// Duplicates.
//
// # Rebalances
//
// On a revocation (a member joins or leaves, or this client closes), the
// Consumer stops taking records of the revoked partitions, drops the ones
// not started, waits up to Config.RevokeTimeout for the ones in flight to
// finish, commits what is done, and only then lets the partitions go. The
// next owner starts exactly after this member's work: a graceful rebalance
// replays nothing. A lost session (kgo.OnPartitionsLost: the member was
// fenced, its session expired) cannot commit any more; the work is
// abandoned and the next owner replays it, as after a crash.
//
// # Retries, in place
//
// Kafka has no per-record redelivery: a partition is a log, and skipping a
// record would commit past it. So an InProgress outcome (another attempt
// holds the lease; lease mode) pauses the partition's fetching and retries
// the same record after Outcome.RetryAfter; a Failed one (the handler or the
// store failed, everything rolled back) after Config.RetryDelay. Later
// records of that partition wait (under OrderKey only those of its key: see
// "Key order"); other partitions go on. A record that can
// never succeed (idem.Outcome.Settle says DeadLetter: missing or invalid
// ID, fingerprint mismatch, poison, or a Failed outcome whose error matches
// idem.ErrPermanent) is produced to Config.DeadLetter with the original key,
// value and headers plus the headers every idem adapter writes
// (Idem-Dead-Letter-Reason, a stable word such as "invalid-message-id";
// Idem-Dead-Letter-Error, the Outcome's error text;
// Idem-Dead-Letter-Status; Idem-Original-Message-Id) and
// [HeaderOriginalTopic], [HeaderOriginalPartition] and
// [HeaderOriginalOffset]; only once the broker has it is the record done. If the produce fails, the
// record is retried instead. In transactional mode a handler that keeps
// failing blocks its partition until fixed: mark errors that no retry can
// fix with idem.Permanent, or use lease mode, whose MaxAttempts turns a
// message that keeps failing into poison.
//
// A handler blocked on something that never answers (a database call
// with no deadline of its own, behind a black-holed network path) would
// hold its partition for ever: each Processor call (each ProcessBatch call
// in batch mode) gets a context that ends after Config.HandlerTimeout (5
// minutes by default), the handler gives up, its transaction rolls back,
// and the Failed record is retried in place after Config.RetryDelay, its
// offset not committed. A handler that ignores its context still holds its
// partition.
//
// Resuming a paused partition takes effect at the broker's next fetch:
// within kgo.FetchMaxWait (5s by default). Lower it for short retry delays.
//
// # Batch mode
//
// With Config.BatchProcessor (idem.BindBatch) the Consumer hands over up to
// Config.BatchSize consecutive records of one partition at a time, in one
// ProcessBatch call: one transaction claims them all with one statement and
// runs the handler once. Each record then follows its own Outcome as above;
// records to retry go back to the head of the partition's queue, in order.
// One handler error fails every new record of the batch; when that error is
// permanent (idem.Permanent), the failed records are run again one per
// ProcessBatch call, in order, so that only the record that causes it is
// dead-lettered and the others are processed.
//
// # Concurrency
//
// Config.Concurrency partitions are processed at once, each by its own
// goroutine; records of one partition never run concurrently, so the
// per-partition order Kafka gives is kept. Records wait in a per-partition
// queue; a partition whose queue is long is paused until it drains.
//
// # Key order
//
// With Config.Order set to OrderKey, records of one partition whose keys
// differ run concurrently, Config.Concurrency records at once over all
// partitions; records with byte-equal keys run one at a time, in offset
// order, each after the one before it is done. Records without a key (nil
// or empty) are one key among themselves. This is a weaker order than
// the partition's: an entity whose events share a key sees them in order,
// but events of different keys are processed, and may finish, in any
// order. Offsets are committed as above, through the longest run of done
// records: a record that is slow, or waiting to be retried, holds the
// committed offset behind it while later records of other keys finish,
// and after a crash those are replayed as Duplicates. A record retried in
// place (InProgress, Failed, a dead letter not produced) holds only its
// key: the later records of that key wait, the others go on. A partition
// is paused while its records not yet committed (queued, in flight,
// waiting to retry, or done behind one that is not) reach max(64,
// 2×Concurrency), so a key that keeps failing does not let the others
// fill memory. Revocation, lost partitions and Stop are as in partition
// order: the queued records not started are dropped, the ones in flight
// (records of several keys) are waited for, a retry wait is cut short
// (that record stays uncommitted), and what is done is committed. Batch
// mode (BatchProcessor) keeps partition order; OrderKey with it is a
// configuration error.
//
// # Fetching ahead
//
// Kafka has no per-record ack deadline: a record polled ahead of the
// workers (up to Config.MaxPollRecords per poll, held in its partition's
// queue) is never redelivered while it waits, however slow the store, and
// kgo heartbeats the group from its own goroutine, so a slow handler does
// not expire the session either (kgo has no max.poll.interval.ms). Records
// come back only after a rebalance or a crash, from the last committed
// offset: on a revocation the Consumer drops the queued records it has not
// started (the next owner reads them, for the first time as far as idem
// is concerned) and commits what finished, so fetching ahead adds no
// redeliveries. What it costs is the time a revocation waits for the
// records in flight (Config.RevokeTimeout), not for the queue.
//
// # Retention
//
// Processed IDs are kept for a retention window (idem.Config.RetentionWindow,
// 7 days by default). A record older than the window that is replayed (a
// group reset to the start, a new group on an old topic) is processed again.
// Set Config.RetentionWindow to the same value and Run reads the consumed
// topics' retention.ms once at start, warning about every topic that keeps
// records longer: such a topic can replay a record whose ID idem has
// already forgotten.
//
// # Offset resets
//
// When franz-go cannot tell where a partition's log goes on (a leader's
// log diverged, an offset fell out of the log) it reports a
// kgo.ErrDataLoss, which the Consumer logs as a fetch error, and resumes at
// kgo.ConsumeResetOffset. franz-go's default (a minute before the last
// record consumed) and NewOffset().AtStart() re-read, which idem makes
// harmless; NewOffset().AtEnd() skips the records not fetched yet and the
// Consumer commits over them, acknowledged to their producers but never
// processed. Run warns once at start about a client reset to the end.
// docs/failover.md measures it.
//
// # Stopping
//
// [Consumer.Stop] stops polling, lets the records in flight finish with
// their context intact, commits, and returns; Run then returns nil. The
// client stays in the group until the caller closes it. Cancelling Run's
// context instead cancels the handlers' context, and Run returns
// ctx.Err().
//
// # Server versions
//
// Supported: Kafka 0.11.0 (the first release with record headers, which
// carry the message ID) through the current 4.x: kgo negotiates each
// request's version with the broker (ApiVersions), and the package needs
// nothing 0.11's protocol lacks. The broker conformance suite
// (broker/brokertest) runs against kfake, franz-go's in-process cluster,
// answering at the newest protocol versions it implements and capped at
// Kafka 0.11.0 (kfake.MaxVersions). A dead letter is final on each: the
// record's offset is committed only once the dead letter's produce is
// acknowledged, and a committed offset is not read again by the group.
package idemkafka

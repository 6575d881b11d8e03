// Package brokertest is the conformance suite every idem broker adapter
// passes against a real broker (JetStream, Kafka, RabbitMQ, Redis Streams).
//
// An adapter's test implements [Harness] (a fresh, isolated [Broker] per
// case: its own stream, topic, queue or key names, and its own dead letter)
// and calls [Run]:
//
//	func TestConformance(t *testing.T) {
//		brokertest.Run(t, brokertest.Harness{New: func(t *testing.T) brokertest.Broker {
//			return newTestBroker(t) // wraps the adapter's Consumer and Producer
//		}})
//	}
//
// Run publishes messages through the adapter's producer helper, puts a
// side-effect table behind the handler and makes redelivery happen the way
// it happens in production, then asserts what the Idempotent Consumer
// pattern promises: the effects table holds exactly one row per message,
// with its payload, every message was processed, the dead letter holds
// exactly the messages that can never be processed, and nothing was lost.
//
// # Claim modes
//
// Every case runs twice, as parallel subtests Run/transactional/<case> and
// Run/lease/<case>, each with its own Broker and its own SQLite database
// (modernc.org/sqlite, through store/idemsql):
//
//   - transactional: idem.NewConsumer over idemsql and idem.Bind, with a
//     handler that inserts one row (message ID, payload) into an effects
//     table in the claim's transaction;
//   - lease: idem.NewLeaseConsumer (3s lease) and idem.BindLease, with a
//     handler that writes the effect outside the claim, keyed by
//     Attempt.Key (INSERT ... ON CONFLICT DO NOTHING), as the pattern asks
//     of effects that cannot join the claim's transaction.
//
// The suite wraps the bound idem.Processor it hands to [Broker.Start] to
// record every outcome and to inject faults (handler errors, a crash between
// commit and ack, a handler held on a barrier).
//
// # Cases
//
// [CaseNames] lists them. In short:
//
//   - ProcessedOnce: 100 messages at concurrency 4 make 100 rows; after a
//     graceful Stop a fresh member processes nothing.
//   - ProducerDuplicates: every message published twice, some a third time
//     after the first copy was processed: one row each; the repeats that
//     reach the consumer are Duplicate outcomes.
//   - CrashAfterCommit: a member commits a message and is crashed
//     ([Member.Crash]) before the adapter can ack it; a new member takes
//     over and gets that message again, as a Duplicate.
//   - HandlerError: a quarter of the handlers fail on the first run; the
//     adapter redelivers them after its retry delay; no dead letters.
//   - AckTimeout: a handler runs past [StartOptions.Redelivery]; a
//     redelivery of its message while it runs waits for it (transactional)
//     or is InProgress and is redelivered later (lease); one row.
//   - BadMessages: messages without an ID, with an invalid ID (control
//     bytes, over 255 bytes where the broker can carry it), reusing an ID
//     with another payload (a fingerprint mismatch), and whose handler
//     returns idem.Permanent, end up in the dead letter, ID and payload byte
//     for byte, with the reason word ("missing-message-id",
//     "invalid-message-id", "fingerprint-mismatch", "permanent") and an
//     error text containing the cause's; none has an effect row, and the
//     permanently failing handler ran once. IDs of 255 bytes and non-ASCII
//     IDs are processed.
//   - GroupCrashAndJoin: two members share the work, one crashes mid-stream,
//     a third joins.
//   - StopWaitsForInFlight: [Member.Stop] does not return while a handler is
//     running, and acknowledges its message: a later member never gets it.
//   - Batch: for a [BatchBroker] only, in transactional mode: the basics
//     through StartBatch and idem.BindBatch, batches no larger than
//     BatchSize, and a crash after a committed batch.
//   - Lifecycle (once, not per mode): through [Broker.NewConsumer], the
//     [Runner] contract: Stop before Run (twice) makes Run return nil; of
//     two Runs at once one returns idem.ErrAlreadyRunning; eight concurrent
//     Stops return nil and so does Run; a Run after Run returned is
//     idem.ErrAlreadyRunning; and no goroutine Run started (counted by a
//     goroutine label the suite puts on the Run call) is left after it.
//   - Panics: a handler that panics and a Processor wrapper that panics:
//     not acknowledged, redelivered, one row each, no dead letters.
//   - StoreDown: the store's *sql.DB is closed under a member: every
//     delivery is Failed with idem.ErrStore, none is acknowledged or
//     dead-lettered, there are no rows; a member on a working handle then
//     processes every message once.
//   - ContextCancelled: Run's context is cancelled while a handler runs:
//     Run returns ctx.Err(), no row stays, and the next member processes
//     the message once.
//   - DeadLetterFinal: an ID-less message and two whose handler returns
//     idem.Permanent are dead-lettered once each and delivered once each
//     (twice if an ack deadline ran out while the first was in flight):
//     for four ack deadlines (Redelivery), and two past the broker's
//     duplicate window ([PublishDeduper]) within which it would drop a
//     repeated dead letter, the broker neither redelivers them nor gets a
//     second dead letter. (A broker that ignores how the adapter refused a
//     message, as nats-server 2.9 ignores "+TERM <reason>", redelivers it
//     every ack deadline, and each time it is dead-lettered again.)
//   - HandlerTimeout: the first attempt of one message blocks until its
//     context ends, which only the adapter's handler timeout
//     ([StartOptions.HandlerTimeout], 500ms) does: that attempt is Failed,
//     not acknowledged, and the message is redelivered and processed once;
//     no dead letters.
//   - StoreLatency: every claim 20-50ms slower (a store across a slow
//     network), one handler, StartOptions.Prefetch 128 and a 2s ack
//     deadline: a full prefetch takes twice the deadline to work through. At most 1.1 deliveries per message (Processor calls, every
//     redelivery counted) and one row each: the adapter fetches only what
//     it can start in time, or keeps the waiting deliveries in progress.
//   - HugePayload (once): a 1 MiB payload (or the [PayloadLimiter]'s
//     limit) is processed, its row byte for byte, and an ID-less one is
//     dead-lettered byte for byte (more than once if its ack deadline ran
//     out while it was being dead-lettered: nothing tells an ID-less
//     message's redelivery from the first delivery).
//
// # What an adapter must do to pass
//
//   - Read the message ID from the broker's place for it (a header or
//     property the broker defines for it where there is one) and pass every
//     delivery to the Processor through idem.Guard, an ID-less one with ID
//     "".
//   - Carry out what idem.Outcome.Settle decides, with a retry delay shorter
//     than StartOptions.Redelivery (the suite uses 1s, and 3s in
//     StopWaitsForInFlight): Ack, Redeliver after Settlement.Delay, or
//     DeadLetter with the original ID and payload and
//     Settlement.DeadLetterHeaders, then ack. Log with Settlement.Log.
//   - Honour StartOptions: Concurrency deliveries at once; Redelivery as the
//     broker's timeout for unacknowledged messages where it has one;
//     Prefetch as the most deliveries held at once, without letting the
//     ones that wait for a handler outlive that timeout; HandlerTimeout as
//     the bound on one delivery's processing (the Processor's context
//     ends after it).
//   - Make a dead letter final: the broker must not deliver the original
//     again, whatever server version it runs.
//   - Stop: take no new deliveries, let the handlers in flight finish with
//     their context intact, ack what finished, then return.
//   - Crash: return at once; from then on nothing of that member reaches the
//     broker (close its connection or client), so the broker redelivers.
//   - NewConsumer: the adapter's Consumer, not running, with the lifecycle
//     of [Runner].
//   - DeadLetters: read the dead letter without consuming it, reporting the
//     idem.HeaderDeadLetterReason and idem.HeaderDeadLetterError values.
//   - A broker that drops repeated publishes itself (JetStream's duplicate
//     window) implements [PublishDeduper], so the suite knows which repeats
//     reach the consumer, and its Publish returns [ErrDeduped] for a publish
//     the broker dropped, so the suite can publish a late repeat again
//     until the broker takes it.
//
// # Outbox
//
// [RunOutbox] runs two cases. The first, on a broker that also implements
// [OutboxBroker] (the adapter's relay idem.Publisher and the Destination
// that reaches the queue its consumers read): 20 rows over 4 ordering keys,
// committed into an idem.MemoryStore outbox and not yet sent (a crash after
// the commit), are sent by an idem.Relay whose first publish call sends
// and then fails every message (a crash after the send, before the mark),
// so those are sent twice. The adapter's consumer, over idem.NewConsumer at
// concurrency 1, must apply each of the 20 exactly once, and each key's in
// emission order; the relay must end with every row sent, none failed. A
// broker that also implements [OutboxUndeliverable] gets 3 rows of one key
// to a destination its Publisher cannot reach among the 20: none is sent,
// and they fail for good or for retry as the broker says, without holding
// back the other keys. The second ("outbox upstream") produces through an
// upstream transactional idem consumer that emits two messages per
// incoming one: a handler error leaves no outgoing rows, a duplicate
// incoming message whose outgoing ones are unsent is acknowledged without
// running the handler or emitting anew, two relays side by side send each
// row exactly once, and the downstream consumer applies each once, in
// order per key.
//
// [RunRelayAcrossKill] runs the relay while the broker's server dies: an
// adapter's test gives it a server of its own that a [ServerKiller] kills
// (SIGKILL) and starts again. The server is killed twice in the middle of a
// publish, after half of a batch was confirmed, and restarted after one
// more publish ran against it dead; every row must end sent and the
// downstream consumer must apply each message once, in order per key.
// The adapter's Publisher must recover by itself (reconnect or redial).
//
// # Timing
//
// The suite orders events with channels and barriers, and polls with
// bounded waits (90s each, generous for a loaded machine under -race) that
// fail with the state reached, e.g. "after 1m30s: 47 of 50 messages have an
// effect row". A few short quiet periods (a few seconds) check that
// something does not happen. A run takes about 10-40 seconds per adapter.
package brokertest

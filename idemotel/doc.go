// Package idemotel turns the hooks of an idem consumer into OpenTelemetry
// metrics and spans: duplicates absorbed (by reason), claims in progress,
// leases renewed, taken over and lost, purges (rows, duration, lag) and
// store errors.
//
// Give the [Observer] to a consumer as one of its hooks:
//
//	obs, err := idemotel.NewObserver()
//	...
//	c, err := idem.NewConsumer(store, idem.Config{Name: "payments", Hooks: []idem.Hook{obs}})
//
// The meter and tracer providers default to the global ones
// (otel.GetMeterProvider, otel.GetTracerProvider); see [WithMeterProvider]
// and [WithTracerProvider]. One Observer may serve any number of consumers:
// every measurement carries the consumer name (idem.consumer).
//
// # Metrics
//
// Names follow the OpenTelemetry semantic conventions (see "Semantic
// conventions" for the version and the table of every name) where one
// applies: messaging.process.duration and the messaging.* attributes, the
// HTTP attributes on the idem.http.* metrics, error.type; the rest are in
// the idem namespace. Every metric has idem.consumer, the idem consumer
// name (idem.Config.Name: the identity deduplication is keyed by). A
// delivery from a broker adapter (which sets idem.Delivery) adds the
// delivery attributes: messaging.system (the adapter's: nats, kafka,
// rabbitmq, redis; else the one of [WithMessagingSystem] for a direct
// Process call), messaging.consumer.group.name only where the broker has
// a consumer group (a Kafka group, a Redis Streams group, a JetStream
// consumer; never RabbitMQ), and messaging.destination.name (the topic,
// queue or stream), or messaging.destination.template where the name may
// vary per message (a NATS subject: the consumer's filter subject or
// stream). None of them is on an idemhttp middleware's metrics (see "HTTP
// requests"). Message IDs are never a metric attribute (unbounded
// cardinality); they are on spans only.
//
//	name                        instrument          unit        attributes (besides the above)         meaning
//	idem.messages               Int64Counter        {message}   idem.mode, idem.status,                deliveries settled, one per message (each
//	                                                            idem.duplicate.reason                  message of a batch counts); for idemhttp, one
//	                                                                                                   per request that reached the store
//	idem.claims                 Int64Counter        {claim}     idem.mode                              new claims: the handler ran
//	idem.claims.active          Int64UpDownCounter  {claim}     idem.mode                              claims in progress: claimed, not yet settled
//	idem.claims.released        Int64Counter        {claim}     idem.mode                              claims given up after an error for a redelivery
//	                                                                                                   (transaction rolled back, lease released)
//	messaging.process.duration  Float64Histogram    s           messaging.operation.name ("process"),  one Process, ProcessTx or ProcessBatch call,
//	                                                            idem.mode, idem.status (single         from start to outcome
//	                                                            deliveries), error.type (on error)     (not idemhttp's requests: see the next one)
//	idem.http.request.duration  Float64Histogram    s           http.request.method, http.route,       one request on an idemhttp middleware's
//	                                                            idem.status,                           idempotency path (rejected ones included),
//	                                                            http.response.status_code,             from the key's parsing to the answer
//	                                                            error.type (on error)
//	idem.http.responses         Int64Counter        {response}  http.response.status_code,             answers on an idemhttp middleware's
//	                                                            idem.status, idem.http.replayed        idempotency path, one per request
//	idem.claim.duration         Float64Histogram    s           idem.mode                              the claim's store round trip (Begin+ClaimTx,
//	                                                                                                   ClaimBatchTx or Acquire)
//	idem.lease.renewals         Int64Counter        {renewal}                                          lease renewals that succeeded
//	idem.lease.takeovers        Int64Counter        {takeover}                                         lease-mode attempts after the first: a retry
//	                                                                                                   after a release, or a takeover of an expired
//	                                                                                                   lease (crash); minus released lease claims,
//	                                                                                                   the crashes
//	idem.lease.lost             Int64Counter        {write}     idem.store.operation                   writes rejected with ErrLeaseLost; "complete"
//	                                                                                                   is a stale completion
//	idem.purge.runs             Int64Counter        {run}       idem.purge.result (ok, skipped, error) purges; skipped: another cleaner held the lock
//	idem.purge.rows             Int64Counter        {row}                                              records purged
//	idem.purge.duration         Float64Histogram    s           idem.purge.result                      how long a purge took
//	idem.purge.lag              Float64Gauge        s                                                  after each successful purge: how far the
//	                                                                                                   horizon trails now minus the retention
//	                                                                                                   window (the newest record's age); grows
//	                                                                                                   while the consumer is idle
//	idem.purge.load             Float64Gauge        1                                                  after each successful purge that has a span
//	                                                                                                   (idem.PurgeEvent.Span): its duration over
//	                                                                                                   that span; at or above 1 the purge deletes
//	                                                                                                   more slowly than records become purgeable
//	idem.store.errors           Int64Counter        {error}     idem.mode, idem.store.operation        failed store calls (connection, timeout)
//
// Attribute values:
//   - idem.mode: transactional, lease.
//   - idem.status: processed, duplicate, in_progress, fingerprint_mismatch,
//     failed, poison (a failed delivery that goes to the dead letter for
//     good), rejected. On the idem.http.* metrics, the status of the
//     core's outcome of the request (idemhttp.ResponseEvent.Outcome), or
//     rejected for a request answered with an error before its key reached
//     the store (400 key missing or invalid, 401 no scope, 413 or 400 body).
//   - idem.duplicate.reason, only on deliveries that found the message
//     known: completed, in_progress, fingerprint_mismatch, poison. The
//     duplicates absorbed are idem.messages{idem.status="duplicate"}.
//   - idem.store.operation: begin, claim, begin and claim, claim batch,
//     commit, rollback, acquire, renew, complete, release, save step,
//     purge; and, for idem.lease.lost, renew, complete, release, step.
//   - error.type: the class of a call's error: store, handler, handler_panic,
//     lease_lost, poison, fingerprint_mismatch, in_progress,
//     invalid_message, closed, canceled. On idem.http.request.duration, the
//     class of the middleware's answer where it has one (422
//     idempotency-key-reused: fingerprint_mismatch; 409 request-in-progress:
//     in_progress; 409 idempotency-lease-lost: lease_lost; 500
//     handler-panic: handler_panic; 503 idempotency-unavailable and
//     fail-open runs: store; no response after a released attempt: handler;
//     a client that left while waiting: in_progress), else the status code
//     of an error status, >= 400 ("400", "401", "410", "500": the semantic
//     conventions' choice for HTTP errors); absent on success.
//   - http.response.status_code: the status of the response an idemhttp
//     request got (idemhttp.ResponseEvent.Status), absent when none was
//     written (the client left, the connection was aborted, a fail-open
//     request). A bounded set: the statuses the handler answers with and
//     the middleware's own (400, 401, 409, 410, 413, 422, 500, 503).
//   - idem.http.replayed: true for a stored response replayed
//     (Idempotent-Replayed: true), else false.
//
// With the Prometheus exporter the names become, e.g., idem_messages_total,
// idem_claims_active, messaging_process_duration_seconds,
// idem_http_request_duration_seconds, idem_http_responses_total and
// idem_purge_lag_seconds, with the
// attributes as labels (dots as underscores).
//
// # Outbox
//
// [OutboxObserver] is the transactional outbox's hook: give it to the
// consumers that emit (idem.HookEmit) and to the relays (idem.HookRelay,
// RelayConfig.Hooks), and the store for the backlog gauges. Its metrics
// (idem.outbox.emitted, sent, send_failures, relay.duration, relay.lag,
// pending, failed, oldest_pending) are listed on the type.
//
// # Spans
//
// Each Process or ProcessTx call is a span named "process " and the
// destination (the subject, topic, queue or stream of the idem.Delivery a
// broker adapter set; "process" alone for a direct call, as the semantic
// conventions name a span whose destination is unknown), of kind consumer,
// started by the idem.HookProcessStart hook so the handler's own spans are
// its children. It has messaging.operation.name "process",
// messaging.operation.type "process", messaging.message.id, the delivery
// attributes (above; messaging.destination.name and, for NATS, also
// messaging.destination.template), idem.consumer, idem.mode, and at the end
// idem.status, idem.duplicate.reason, idem.attempt and error.type. A
// ProcessBatch call is one span with messaging.batch.message_count instead
// of a message ID. The claim, lease renewals, takeovers, lost leases and
// store errors are span events. Failed, rejected and mismatched deliveries
// set the span status to Error (a batch span too, when one of its messages
// is such a delivery); duplicates and in-progress deliveries do not. A
// delivery without a message ID has no messaging.message.id. A purge is a
// span "purge " and the consumer name, of kind internal.
//
// # Semantic conventions
//
// Every name idem emits, and where it comes from: OpenTelemetry semantic
// conventions v1.43.0 (go.opentelemetry.io/otel/semconv/v1.43.0; the
// meter's and tracer's schema URL is https://opentelemetry.io/schemas/1.43.0)
// for messaging, HTTP and errors; "idem" where no convention has a name for
// the thing (idem's own concepts: claims, leases, purges, duplicate
// reasons). The database conventions name database commands
// (db.operation.name, db.client.operation.duration): idem's store calls
// (claim, renew, purge) are calls of its store interface, not commands of
// one database, and the store behind it is not known to the Observer, so
// they stay idem.store.operation and idem.claim.duration. A test reads
// this table and checks every metric and span attribute the Observer
// emits against it.
//
//	name                            kind       convention
//	messaging.process.duration      metric     messaging v1.43.0
//	idem.messages                   metric     idem
//	idem.claims                     metric     idem
//	idem.claims.active              metric     idem
//	idem.claims.released            metric     idem
//	idem.claim.duration             metric     idem
//	idem.http.request.duration      metric     idem
//	idem.http.responses             metric     idem
//	idem.lease.renewals             metric     idem
//	idem.lease.takeovers            metric     idem
//	idem.lease.lost                 metric     idem
//	idem.purge.runs                 metric     idem
//	idem.purge.rows                 metric     idem
//	idem.purge.duration             metric     idem
//	idem.purge.lag                  metric     idem
//	idem.purge.load                 metric     idem
//	idem.store.errors               metric     idem
//	messaging.system                attribute  messaging v1.43.0
//	messaging.operation.name        attribute  messaging v1.43.0
//	messaging.operation.type        attribute  messaging v1.43.0
//	messaging.destination.name      attribute  messaging v1.43.0
//	messaging.destination.template  attribute  messaging v1.43.0
//	messaging.consumer.group.name   attribute  messaging v1.43.0
//	messaging.message.id            attribute  messaging v1.43.0
//	messaging.batch.message_count   attribute  messaging v1.43.0
//	http.request.method             attribute  http v1.43.0
//	http.route                      attribute  http v1.43.0
//	http.response.status_code       attribute  http v1.43.0
//	error.type                      attribute  error v1.43.0
//	exception.message               attribute  exception v1.43.0
//	idem.consumer                   attribute  idem
//	idem.mode                       attribute  idem
//	idem.status                     attribute  idem
//	idem.duplicate.reason           attribute  idem
//	idem.attempt                    attribute  idem
//	idem.record.id                  attribute  idem
//	idem.token                      attribute  idem
//	idem.store.operation            attribute  idem
//	idem.purge.result               attribute  idem
//	idem.purge.rows                 attribute  idem
//	idem.purge.batches              attribute  idem
//	idem.http.replayed              attribute  idem
//
// # Trace context across brokers
//
// Producers write the W3C trace context (traceparent, tracestate, and
// baggage) of the span that publishes into the message's headers when
// given [InjectTraceContext] (idemnats.WithHeaderInjector, InjectHeaders in
// the ProducerConfig of idemkafka, idemamqp and idemredisstream; the
// idemhttp proxy's ProxyOptions.InjectHeaders for the requests it
// forwards). Each consumer adapter puts an idem.Delivery in the context of
// the delivery (its messaging.system, the destination, its consumer group
// and the message's headers) and the Observer extracts the creation
// context from the headers with the propagator of [WithPropagator]: the
// process span is its child, and links to it, so one trace runs from the
// publish to the handler's effects. Under an ambient span (the caller's
// own) the process span stays the ambient span's child and only links to
// the creation context, as the messaging conventions advise; a batch span
// links to every message's creation context. The idemhttp middleware
// gives the request's headers the same way, so an untraced server still
// continues the caller's traceparent. Messages emitted through the
// outbox carry the trace too when the consumer's idem.Config.OutboxHeaders
// is [InjectTraceContext]: the trace context of the span processing the
// incoming message is stored in the outbox row's headers, and the relay
// publishes it with the message, however much later and from whichever
// process, so the downstream process span is that span's child. Neither idem nor the adapters
// depend on OpenTelemetry: the seam is idem.Delivery and
// idem.HeaderInjector.
//
// # HTTP requests
//
// Package idemhttp's middleware reports through the same hooks (give the
// Observer in its Options.Hooks): a request on its idempotency path that
// reaches the store is one lease-mode delivery of the consumer "idemhttp:"
// and its namespace (names starting with [HTTPConsumerPrefix]), whose
// message ID is the record ID (the SHA-256 of the scope, truncated, and the
// key); and every request on the path, those answered before the store
// included, ends with an idemhttp.ResponseEvent, which the Observer gets
// as an idemhttp.HookResponse ([Observer.OnResponse]). For those consumers
// the Observer:
//   - counts idem.messages, idem.claims and the rest from the core's
//     events, without the HTTP status (processed: the handler ran;
//     duplicate: a replay, a 410, 422 for an expired key, 500 for a corrupt
//     record; in_progress: 409; fingerprint_mismatch: 422; failed: 5xx, 408
//     or 429 that released the key, 500 for a panic, 503 when the store
//     failed);
//   - records idem.http.request.duration and idem.http.responses from the
//     ResponseEvent, with http.response.status_code, and no
//     messaging.process.duration;
//   - sets http.response.status_code on the span of the ResponseEvent's
//     context, the request's (the HTTP server span, when the server is
//     traced), if it is recording: the idempotency span has ended by then;
//   - never sets messaging.system, even when [WithMessagingSystem] is given
//     (an HTTP request went through no broker), so one Observer can serve
//     a service's consumers and its HTTP middleware;
//   - names the span "idempotency " and the consumer name, of kind
//     internal (a child of the HTTP server span, when the server is
//     traced; the handler's spans are its children), with idem.record.id
//     instead of messaging.message.id and no messaging.operation.*.
//
// The scope, the key and the path are never metric attributes (unbounded
// cardinality, and the scope identifies a user); the record ID, which
// holds the key and only a hash of the scope, is on spans only.
package idemotel

// Package idemotel turns the hooks of an idem consumer into OpenTelemetry
// metrics and spans: duplicates absorbed (by reason), claims in progress,
// leases renewed, taken over and lost, purges (rows, duration, lag) and
// store errors.
//
// Give the [Observer] to a consumer as one of its hooks:
//
//	obs, err := idemotel.NewObserver(idemotel.WithMessagingSystem("kafka"))
//	...
//	c, err := idem.NewConsumer(store, idem.Config{Name: "payments", Hooks: []idem.Hook{obs}})
//
// The meter and tracer providers default to the global ones
// (otel.GetMeterProvider, otel.GetTracerProvider); see [WithMeterProvider]
// and [WithTracerProvider]. One Observer may serve any number of consumers:
// every measurement carries the consumer name.
//
// # Metrics
//
// Names follow the OpenTelemetry semantic conventions for messaging where
// one applies (messaging.process.duration, and the messaging.* attributes);
// the rest are in the idem namespace. Every metric has the attribute
// messaging.consumer.group.name, the idem consumer name (the identity
// deduplication is keyed by, which plays the part of a consumer group), and
// messaging.system when [WithMessagingSystem] set it (except on an idemhttp
// middleware's metrics: see "HTTP requests"). Message IDs are never
// a metric attribute (unbounded cardinality); they are on spans only.
//
//	name                        instrument          unit        attributes (besides the two above)     meaning
//	idem.messages               Int64Counter        {message}   idem.mode, idem.status,                deliveries settled, one per message (each
//	                                                            idem.duplicate.reason,                 message of a batch counts); for idemhttp, one
//	                                                            http.response.status_code (idemhttp)   per request on the idempotency path
//	idem.claims                 Int64Counter        {claim}     idem.mode                              new claims: the handler ran
//	idem.claims.active          Int64UpDownCounter  {claim}     idem.mode                              claims in progress: claimed, not yet settled
//	idem.claims.released        Int64Counter        {claim}     idem.mode                              claims given up after an error for a redelivery
//	                                                                                                   (transaction rolled back, lease released)
//	messaging.process.duration  Float64Histogram    s           messaging.operation.name ("process"),  one Process, ProcessTx or ProcessBatch call,
//	                                                            idem.mode, idem.status (single         from start to outcome
//	                                                            deliveries), error.type (on error)     (not idemhttp's requests: see the next one)
//	idem.http.request.duration  Float64Histogram    s           idem.mode, idem.status,                one request on an idemhttp middleware's
//	                                                            http.response.status_code,             idempotency path, from the key's parsing to
//	                                                            error.type (on error)                  the outcome
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
//	idem.store.errors           Int64Counter        {error}     idem.mode, idem.store.operation        failed store calls (connection, timeout)
//
// Attribute values:
//   - idem.mode: transactional, lease.
//   - idem.status: processed, duplicate, in_progress, fingerprint_mismatch,
//     failed, poison (a failed delivery that goes to the dead letter for
//     good), rejected.
//   - idem.duplicate.reason, only on deliveries that found the message
//     known: completed, in_progress, fingerprint_mismatch, poison. The
//     duplicates absorbed are idem.messages{idem.status="duplicate"}.
//   - idem.store.operation: begin, claim, begin and claim, claim batch,
//     commit, rollback, acquire, renew, complete, release, save step,
//     purge; and, for idem.lease.lost, renew, complete, release, step.
//   - error.type: the class of a call's error: store, handler, handler_panic,
//     lease_lost, poison, fingerprint_mismatch, in_progress,
//     invalid_message, closed, canceled; for an idemhttp request whose error
//     is none of these, the HTTP status code ("401", "422", "503": the
//     semantic conventions' choice for HTTP errors).
//   - http.response.status_code: the status of the response an idemhttp
//     request got (idem.OutcomeEvent.HTTPStatus), absent when none was
//     written (the client left, the connection was aborted, a fail-open
//     request). A bounded set: the statuses the handler answers with and
//     the middleware's own (400, 401, 409, 410, 413, 422, 500, 503).
//
// With the Prometheus exporter the names become, e.g., idem_messages_total,
// idem_claims_active, messaging_process_duration_seconds,
// idem_http_request_duration_seconds and idem_purge_lag_seconds, with the
// attributes as labels (dots as underscores).
//
// # Spans
//
// Each Process or ProcessTx call is a span named "process " and the
// consumer name (the semantic conventions name a process span after its
// destination, which idem does not know), of kind consumer, started by the
// idem.HookProcessStart hook so the handler's own spans are its children.
// It has messaging.operation.name "process", messaging.operation.type
// "process", messaging.consumer.group.name, messaging.message.id,
// messaging.system when set, idem.mode, and at the end idem.status,
// idem.duplicate.reason, idem.attempt and error.type. A ProcessBatch call is
// one span with messaging.batch.message_count instead of a message ID. The
// claim, lease renewals, takeovers, lost leases and store errors are span
// events. Failed, rejected and mismatched deliveries set the span status to
// Error (a batch span too, when one of its messages is such a delivery);
// duplicates and in-progress deliveries do not. A delivery without a
// message ID has no messaging.message.id. A purge is a span
// "purge " and the consumer name, of kind internal.
//
// # HTTP requests
//
// Package idemhttp's middleware reports through the same hooks (its
// Options.Hooks): a request on its idempotency path is one lease-mode
// delivery of the consumer "idemhttp:" and its namespace (names starting
// with [HTTPConsumerPrefix]), whose message ID is the record ID (the SHA-256
// of the scope, truncated, and the key). For those consumers the Observer:
//   - counts idem.messages with http.response.status_code besides the
//     status and reason (processed: the handler's status; duplicate: the
//     replayed status, or 410; in_progress: 409; fingerprint_mismatch:
//     422; rejected: 400, 401, 413 or 422 for an expired key; failed: 5xx,
//     408 or 429 that released the key, 500 for a panic, 503 when the
//     store failed);
//   - records idem.http.request.duration instead of
//     messaging.process.duration;
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

// Package idemhttp makes retrying an HTTP request safe: a net/http
// middleware that honours the Idempotency-Key header
// (draft-ietf-httpapi-idempotency-key-header, with Stripe's behaviour where
// the draft is silent), a
// Go client that retries with the same key, a reverse proxy that puts
// the middleware in front of any HTTP service, and a [Deliverer] that
// delivers broker messages to an HTTP service once (`idem consume`).
//
// # The middleware
//
// [New] builds a [Middleware] over any [idemdriver.LeaseStore]: the memory
// store, PostgreSQL (store/idempgxv5 or store/idemsql), MariaDB/MySQL and
// SQLite (store/idemsql), or Redis (store/idemredis). [Middleware.Wrap]
// protects a handler; [Middleware.Require] also makes the key mandatory.
//
// A request with a covered method (POST and PATCH by default; GET, HEAD
// and OPTIONS always pass through) and a key goes through these steps:
//
//  1. The key is parsed ([ParseKey]): an RFC 9651 sf-string, lenient by
//     default (a bare token is accepted too), strict as an option; 1 to 255
//     bytes; one field line. Invalid: 400.
//  2. The scope function (mandatory: [ErrNoScope]) names the principal or
//     tenant; the record is keyed by (namespace, SHA-256 of the scope,
//     key), never one global namespace: one user never gets another's response.
//  3. The body is read once, hashed while it is read, and spooled (memory
//     up to Options.MemoryBodyBytes, then a temporary file), so the
//     fingerprint is known before the claim without holding a large body
//     in the heap. The fingerprint ([Fingerprint]) covers the method, the
//     path, the sorted query, the media type, any method-override header
//     (X-HTTP-Method-Override and the like) and the body's SHA-256. The
//     handler reads the same bytes from the spool.
//  4. The key is claimed with a lease and a fencing token by the core's
//     lease engine (idem.LeaseConsumer.Acquire, consumer
//     "idemhttp:"+Namespace, message ID the record ID), which renews it every
//     Lease/3 while the handler runs. Without Options.Wait the claim, too,
//     runs on a context detached from the client's (bounded by
//     Options.StoreTimeout): a client that hangs up while the key is
//     claimed does not turn the claim into a store error. The handler's
//     context carries the request's values but not its cancellation: a
//     client that hangs up does not stop the handler half-way (Stripe's
//     requests, too, run to their end, and the retry gets the stored
//     response). It is cancelled with cause idem.ErrLeaseLost if the lease
//     is lost, and [AttemptFromContext] lets the handler check the lease
//     itself. Under Options.AfterCrash = AnswerUnknownAfterCrash (a
//     Proxy's default) a recovery point is recorded first, so a takeover
//     after a crash answers outcome-unknown instead of running the request
//     again.
//  5. The response is recorded while it is written: held back until the
//     handler returns (so the client never sees a success that is not
//     recorded), or streamed at once when the handler calls Flush or the
//     body outgrows Options.MaxResponseBytes. Then the key is completed
//     with the response, or released, on a context detached from the
//     client's: a client that hangs up does not lose the stored result.
//
// What a request finds, and gets:
//
//	no record, or a released one        the handler runs (attempt 1, 2, ...)
//	completed, same fingerprint         replay: status, headers, body, Idempotent-Replayed: true
//	completed, over the cap             410 replay-unavailable (never run again)
//	in progress, same fingerprint       409 request-in-progress + Retry-After (or Options.Wait, then replay)
//	any record, other fingerprint       422 idempotency-key-reused
//	completed, older than ReplayWindow  422 idempotency-key-expired (tombstone mode only)
//	undecodable record                  500 idempotency-record-corrupt (never treated as absent)
//	store unreachable                   503 idempotency-unavailable + Retry-After (Options.FailOpen: run unprotected)
//
// What a response does to its key (Options.ReleaseStatus, or
// [SetDisposition] from the handler):
//
//	2xx, 3xx, 4xx but 408 and 429       stored and replayed, 4xx included (Stripe's rule)
//	5xx, 408, 429                       released: the retry runs the handler again
//	handler panic                       released; 500 handler-panic if nothing was sent yet
//	Hijack (WebSocket upgrade)          refused with ErrHijackNotSupported; released
//	body over MaxResponseBytes          sent in full; completed, not replayable
//	final write fails                   retried with backoff while the lease is held; when the
//	                                    lease is lost first, a response not yet sent becomes 503
//	                                    idempotency-unavailable (Options.CompleteFailure) and the
//	                                    takeover runs again (at least once) or answers
//	                                    outcome-unknown (Options.AfterCrash)
//
// A released key keeps its record (in progress, lease ended): the next
// request with the same fingerprint takes it over as the next attempt,
// with a higher fencing token; one with another fingerprint gets 422,
// like any reuse of a key.
//
// Stored headers: everything the handler set except hop-by-hop headers
// (and those named by Connection), Date, Content-Length (set again on
// replay), trailers, Set-Cookie (unless Options.StoreSetCookie) and the
// headers an outer middleware had already set with the same values.
// Multi-valued headers keep their order. The stored record is versioned
// (content type "application/vnd.idem.http-response; v=1").
//
// # Delivering messages to a service
//
// [Deliverer] is the other direction: an idem.Processor, driven by any
// broker adapter, that POSTs each message to a service with its message ID
// as Idempotency-Key and records the answer under the core's lease engine
// before the delivery is settled. It is at most once by default, like a
// Proxy: a recovery point is recorded before each call (by the store write
// that acquires the message, on a store that is an
// idemdriver.StepRecorder, as every store of this repository is; the
// release after a known failure likewise records that it is settled), so
// a call whose outcome is unknown (the connection broke after sending, or the process
// died) is dead-lettered with reason outcome-unknown (idem.ErrOutcomeUnknown)
// instead of being sent again. Its type documentation has the table of
// answers and what each does to the message.
// It is also an idem.BatchProcessor (ProcessBatch): a broker's fetched
// batch is claimed in one store call and its answers recorded in one more,
// each message settled as Process would settle it.
//
// # Errors
//
// The middleware's own answers are application/problem+json (RFC 9457)
// with Cache-Control: no-store, a distinct type per condition (the
// Problem* constants, under [ProblemTypeBase]), a status equal to the HTTP
// status, a title and a detail; 409 and 503 carry Retry-After. They are
// never stored. [Problem] is also a Go error matching a sentinel
// (ErrKeyInvalid, ErrInProgress, ...); [ReadProblem] decodes one on the
// client side.
//
// # Handlers
//
// [FromContext] gives a handler the key, scope, attempt and fencing token
// of its request; [Info.DeriveKey] derives a stable key for a call to a
// third party (Stripe, an email provider), identical on every attempt.
//
// # Retention
//
// Completed keys are kept for Options.Retention (24 hours by default) of
// running time of the namespace (the core's retention, idem.Purge), and
// deleted by [Middleware.Purge] or the lease engine's background loop that
// New starts and Close stops; after that the key is new again. Options.ReplayWindow adds a tombstone mode: past the
// window (counted from the first request's arrival), a retry gets 422
// idempotency-key-expired instead of a replay or a new execution.
//
// # The proxy
//
// [NewProxy] puts the middleware in front of any HTTP service ([Proxy];
// `idem proxy` serves one). Its scope is the ScopeHeader of the request
// (Authorization by default), so keys are per credential.
//
// # Keying the proxy's scope
//
// Set ProxyOptions.ScopeSecret (`idem proxy --scope-secret`, or better
// IDEM_SCOPE_SECRET, which does not show in the process list): a random
// per-deployment key of at least [MinScopeSecretBytes] bytes, the same on
// every proxy that shares the store's namespace, kept out of the store.
// The scope is then the HMAC-SHA-256 of the header under that key
// ([HMACHeaderScope]), and the record ID a hash of that. Without it the
// scope is the unkeyed SHA-256 of the header ([HeaderScope], the earlier
// behaviour, kept so existing records still match), and whoever can read
// the store can hash guesses of the credentials (a Basic password, a short
// API key) and compare offline; NewProxy then logs a warning once.
//
// Migration: introducing the secret, or changing it, changes every scope.
// A key recorded before the change is not found after it: a retry within
// the retention window of a request answered before the change is
// forwarded to the upstream again instead of replayed, and a request in
// flight at the change can reach the upstream twice. The old records are
// never matched again and are purged by retention as usual. There is no
// window in which both the old and the new scope are accepted. To avoid
// double execution, roll the change out when no client is retrying: in a
// quiet period, or after draining traffic for longer than your clients'
// retry horizon (a client that stopped retrying cannot be hurt); or put
// the change behind an upstream that deduplicates by the forwarded
// Idempotency-Key itself. Rotate the secret only when it may have leaked.
//
// The health path (ProxyOptions.HealthPath, /healthz) answers 200
// {"status":"ok"} or 503 {"status":"unavailable"}, a fixed body; the
// store's error goes to Options.Logger.
//
// # Observability
//
// [Middleware.Stats] counts what the middleware did. Options.Hooks takes
// the core's hooks (idem.Hook), so the same observers serve consumers and
// HTTP APIs: idemotel's Observer gives metrics and spans (see its "HTTP
// requests" section), idem.LogHook log records. A request on the
// idempotency path is reported as one lease-mode delivery of the consumer
// "idemhttp:"+Namespace ([Middleware.Consumer]) whose message ID is the
// record ID ([Middleware.RecordID]), reported by the core's lease engine:
// exactly one idem.HookProcessStart call (its context becomes the
// request's, down to the handler), one idem.HookOutcome call and one
// idem.HookProcessEnd call, in that order. The HTTP side is idemhttp's
// own event: a [HookResponse] in Options.Hooks gets one [ResponseEvent]
// per request on the idempotency path, with the status the client got
// (0 when none) and the problem type, after the core's events. Requests
// answered before their key reached the store (400 key missing or
// invalid, 401 no scope, 413 or 400 body) get only the ResponseEvent.
// The core's outcomes:
//
//	answer                                 Outcome.Status        DuplicateReason       other events
//	handler ran, response stored           Processed             -                     Claim (+ LeaseTakenOver when Attempt > 1)
//	replay                                 Duplicate             completed
//	410 replay-unavailable                 Duplicate             completed
//	409 request-in-progress                InProgress            in_progress
//	client left during Options.Wait        InProgress            in_progress           (ResponseEvent.Status 0)
//	422 idempotency-key-reused             FingerprintMismatch   fingerprint_mismatch
//	422 idempotency-key-expired            Duplicate             completed
//	500 idempotency-record-corrupt         Duplicate             completed
//	5xx, 408, 429, DispositionRelease,     Failed, Released      -                     Claim; LeaseLost or StoreError
//	Hijack, handler panic: key released                                                (op "release") if the release fails
//	final write failed (503, or the        Failed                -                     Claim; LeaseLost or StoreError
//	response as it was)                                                                (op "complete")
//	503 store unavailable, 500 store       Failed                -                     StoreError (op "acquire")
//	refused, FailOpen run
//	outcome-unknown stored after a crash   Processed             -                     Claim, LeaseTakenOver
//
// While the handler runs, each lease renewal is an idem.HookLeaseRenewed
// call, and a failed one an idem.HookLeaseLost (op "renew") or an
// idem.HookStoreError call. Each purge ([Middleware.Purge], or the loop) is
// an idem.HookPurge call. Outcome errors match the core's sentinels where
// one applies (idem.ErrFingerprintMismatch, idem.ErrInProgress,
// idem.ErrStore, idem.ErrLeaseLost, idem.ErrHandlerPanic,
// idem.ErrInvalidMessageID for an invalid key, idem.ErrMissingMessageID
// for a missing one, idem.ErrInvalidPayload for a body refused) and, for
// the middleware's own answers, the [Problem] written. Requests that pass
// through (a method not covered, no key on an optional route,
// PassUnscoped) emit nothing. A hook that panics is recovered and logged
// on Options.Logger; the request goes on. No event carries the scope in
// clear. idem.LogHook logs replays and 409s at debug level only, but
// rejected and key-reused requests (client mistakes, for an API) at warn.
package idemhttp

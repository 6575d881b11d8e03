// Package idemgrpc brings idempotency keys to gRPC: a unary server
// interceptor that runs a call at most once per key and replays its
// stored result, and a unary client interceptor that sends one key per
// logical call and retries it. The semantics are the HTTP middleware's
// (package idemhttp: draft-ietf-httpapi-idempotency-key-header, with
// Stripe's behaviour where the draft is silent), carried over to gRPC's
// metadata and status codes.
//
// # The server interceptor
//
// [New] builds a [Server] over any idemdriver.LeaseStore: the memory
// store, PostgreSQL (store/idempgxv5 or store/idemsql), MariaDB/MySQL and
// SQLite (store/idemsql), or Redis (store/idemredis);
// [Server.UnaryServerInterceptor] is the interceptor. A call to a covered
// method (Options.Methods; all by default) with the idempotency-key
// metadata entry goes through these steps:
//
//  1. The key is parsed as the HTTP header is (idemhttp.ParseKey): a bare
//     token such as a UUID, or an RFC 9651 sf-string ("..."); 1 to 255
//     bytes; exactly one metadata value. Invalid: INVALID_ARGUMENT. With
//     no key the call passes through, unless Options.RequireKey.
//  2. The scope function (mandatory: [ErrNoScope]) names the principal or
//     tenant from the call's context (its peer, its metadata, what an
//     authentication interceptor put there); the record is keyed by
//     (namespace, SHA-256 of the scope, key), never one global namespace.
//  3. The fingerprint ([Fingerprint]) is the SHA-256 of the full method
//     name, the request's message type and its deterministic protobuf
//     encoding: the same key with another method or request is a reuse.
//  4. The key is claimed with a lease and a fencing token by the core's
//     lease engine (idem.LeaseConsumer.Acquire, consumer
//     "idemgrpc:"+Namespace, message ID [Server.RecordID]), renewed every
//     Lease/3 while the handler runs; the handler's context is cancelled
//     with cause idem.ErrLeaseLost if the lease is lost. Under
//     Options.AfterCrash = idemhttp.AnswerUnknownAfterCrash a recovery
//     point is recorded first, so a takeover after a crash answers
//     outcome-unknown instead of running the call again.
//  5. The result (the response message, or the status with its code,
//     message and details, and the metadata the handler set) is stored, or
//     the key released, on
//     a context detached from the caller's: a caller that gives up does
//     not lose the stored result.
//
// Every answer on the idempotency path echoes the key in its header
// metadata; a replay also carries idempotent-replayed: true in its header
// and trailer metadata ([MetadataReplayed]). The header and trailer
// metadata the handler set (grpc.SetHeader, grpc.SendHeader,
// grpc.SetTrailer) are stored with the result and replayed, but for
// gRPC's reserved grpc-* keys. Replayed responses are built from the
// protobuf global registry (the response type must be linked into the
// server, as generated code is).
//
// # Status codes
//
// What a call finds, and gets. The interceptor's own answers carry a
// google.rpc.ErrorInfo (domain [ErrorDomain], one reason per condition)
// and, where a retry may succeed later, a google.rpc.RetryInfo.
//
//	condition (HTTP middleware's answer)      code                 reason                        RetryInfo
//	no record, or a released one              the handler runs
//	completed                                 the stored response or status, replayed
//	in progress (409)                         ABORTED              REQUEST_IN_PROGRESS           InProgressRetryAfter
//	another method or request (422)           FAILED_PRECONDITION  IDEMPOTENCY_KEY_REUSED        -
//	key invalid (400)                         INVALID_ARGUMENT     IDEMPOTENCY_KEY_INVALID       -
//	key missing, RequireKey (400)             INVALID_ARGUMENT     IDEMPOTENCY_KEY_MISSING       -
//	no scope (401)                            UNAUTHENTICATED      IDEMPOTENCY_SCOPE_MISSING     -
//	store unreachable (503)                   UNAVAILABLE          IDEMPOTENCY_UNAVAILABLE       UnavailableRetryAfter
//	store refused the claim (500)             INTERNAL             IDEMPOTENCY_UNAVAILABLE       -
//	undecodable or failed record (500)        INTERNAL             IDEMPOTENCY_RECORD_CORRUPT    -
//	ran, result not recorded (503)            UNAVAILABLE          RESPONSE_NOT_RECORDED         Lease
//	another attempt took the key over (409)   ABORTED              IDEMPOTENCY_LEASE_LOST        InProgressRetryAfter
//	earlier attempt crashed, at most once     UNKNOWN              REQUEST_OUTCOME_UNKNOWN       - (stored, replayed)
//	request is not a proto.Message            INTERNAL             NOT_A_PROTO_MESSAGE           -
//
// Why these codes, by gRPC's status-code guidance (the status codes page
// of grpc.io, doc/statuscodes.md in grpc/grpc, and the litmus test in the
// comments of google.rpc.Code: UNAVAILABLE if the client can retry just the failing
// call, ABORTED if it should retry at a higher level or after a
// concurrency conflict, FAILED_PRECONDITION if it should not retry until
// the system's state is fixed; INVALID_ARGUMENT for arguments that are
// wrong whatever the state):
//
//   - In progress is ABORTED: a concurrency conflict with another attempt
//     holding the key, which the guidance's description of ABORTED
//     ("typically due to a concurrency issue such as a sequencer check
//     failure") names, and the code google.rpc.Code maps HTTP's 409 to.
//     UNAVAILABLE would also be safe to retry, but it says the service
//     is down, and generic retry policies would retry it blindly; ABORTED
//     with REQUEST_IN_PROGRESS and a RetryInfo tells this package's client
//     (and any client that reads the details) exactly when to retry.
//   - A reused key is FAILED_PRECONDITION, not INVALID_ARGUMENT: the
//     request is valid; what refuses it is the state (the key is bound to
//     another request), and retrying it as it is never succeeds, which is
//     the guidance's FAILED_PRECONDITION case. Not ALREADY_EXISTS, which
//     would suggest the caller's own request had succeeded.
//   - An invalid or missing key is INVALID_ARGUMENT: wrong whatever the
//     state. A missing principal is UNAUTHENTICATED (HTTP 401).
//   - The store being unreachable is UNAVAILABLE, the transient condition
//     the guidance reserves it for: the client retries the same call with
//     the same key.
//   - outcome-unknown is UNKNOWN: whether the earlier run took effect is
//     literally not known. It is stored, so every retry gets it again.
//
// # Stored or released
//
// Options.ReleaseCode ([DefaultReleaseCode]) decides whether a handler's
// status is the key's result or releases the key for the next retry. The
// default mirrors the HTTP middleware (5xx, 408 and 429 release; 2xx and
// 4xx are stored, Stripe's rule) through google.rpc.Code's HTTP mapping:
//
//	stored and replayed   OK, INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED,
//	                      UNAUTHENTICATED, FAILED_PRECONDITION, OUT_OF_RANGE
//	released              UNKNOWN, INTERNAL, DATA_LOSS, UNIMPLEMENTED, UNAVAILABLE,
//	                      DEADLINE_EXCEEDED (5xx), RESOURCE_EXHAUSTED (429), CANCELLED
//	                      (the caller left), ABORTED (a conflict: nothing took effect;
//	                      Stripe saves no result for a conflicting request)
//	handler panic         released; the panic goes on up to a recovery interceptor
//
// # The client interceptor
//
// [NewClientInterceptor] gives each logical call one key (the caller's,
// from the outgoing metadata or [ContextWithKey], or a new UUIDv7), sends
// it on every attempt, and retries UNAVAILABLE, ABORTED from this package
// for a call in progress or a lease taken over, and RESOURCE_EXHAUSTED
// with a RetryInfo: exponential backoff with full jitter
// (github.com/cenkalti/backoff/v5), or the server's RetryInfo delay. It
// never retries a reused key, an invalid argument or outcome-unknown.
//
// # Crashes
//
// A server that dies while its handler runs leaves the key in progress
// until its lease runs out; retries meanwhile get ABORTED
// REQUEST_IN_PROGRESS. Then the next retry takes the key over as attempt
// 2, with a higher fencing token, and by default runs the handler again
// (at least once: make the handler's effects idempotent with
// idem.Attempt.Key or the key itself); with
// Options.AfterCrash = idemhttp.AnswerUnknownAfterCrash it stores and
// answers UNKNOWN REQUEST_OUTCOME_UNKNOWN instead (at most once).
//
// # Retention and observability
//
// Completed keys are kept for Options.Retention (24 hours by default, the
// draft's and Stripe's) of running time of the namespace (idem.Purge),
// and deleted by [Server.Purge] or the background loop. [Server.Stats]
// counts what the interceptor did; Options.Hooks takes the core's hooks,
// so idemotel and idem.LogHook observe gRPC calls as they observe
// messages: each call on the idempotency path is one lease-mode delivery.
package idemgrpc

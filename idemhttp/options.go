package idemhttp

import (
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/keyed"
)

// Defaults applied by New to zero Options fields.
const (
	// DefaultMaxKeyLength is the longest Idempotency-Key accepted, in bytes
	// of the decoded key (1 to 255 bytes:
	// the IETF draft leaves the length open; Stripe allows 255).
	DefaultMaxKeyLength = 255
	// DefaultLease is how long a request owns its key before a duplicate may
	// take over; the middleware renews it every Lease/3 while the handler
	// runs, so only a crashed process lets it run out.
	DefaultLease = 30 * time.Second
	// DefaultRetention is how long a completed key is kept: 24 hours (the
	// IETF draft's and Stripe's "at least 24 hours").
	DefaultRetention = 24 * time.Hour
	// DefaultPurgeInterval is the period of the background purge loop.
	DefaultPurgeInterval = time.Hour
	// DefaultPurgeBatchSize is the most records one purge statement deletes.
	DefaultPurgeBatchSize = 1000
	// DefaultMaxRequestBytes is the largest request body fingerprinted: 10
	// MiB. A larger body gets 413 before the handler runs.
	DefaultMaxRequestBytes = 10 << 20
	// DefaultMemoryBodyBytes is how much of a request body is kept in memory
	// while it is fingerprinted: 1 MiB; the rest is spooled to a temporary
	// file, so large bodies never sit in the heap.
	DefaultMemoryBodyBytes = 1 << 20
	// DefaultMaxResponseBytes is the largest response body stored for
	// replay: 1 MiB. A larger response is still sent in full, and its key
	// is completed but not replayable.
	DefaultMaxResponseBytes = 1 << 20
	// DefaultInProgressRetryAfter is the Retry-After of a 409
	// request-in-progress answer.
	DefaultInProgressRetryAfter = time.Second
	// DefaultUnavailableRetryAfter is the Retry-After of a 503
	// idempotency-unavailable answer.
	DefaultUnavailableRetryAfter = 2 * time.Second
	// DefaultStoreTimeout bounds each store call. The final write (Complete
	// or Release) runs on a context detached from the client's, bounded by
	// this timeout only, so a client that hangs up does not lose the result.
	DefaultStoreTimeout = 10 * time.Second
)

// MaxNamespaceLength is the longest Options.Namespace accepted, in bytes.
const MaxNamespaceLength = 200

// Errors returned by New. Both match idem.ErrInvalidConfig too.
var (
	// ErrInvalidOptions means an Options field is out of range or missing.
	ErrInvalidOptions = fmt.Errorf("idemhttp: invalid options: %w", idem.ErrInvalidConfig)
	// ErrNoScope means Options.Scope is nil. Idempotency keys are always
	// scoped to a principal or tenant: one global namespace would let one user replay another's
	// response, so there is no default.
	ErrNoScope = fmt.Errorf("%w: Scope is mandatory (keys are per principal or tenant, never global)", ErrInvalidOptions)
)

// UnscopedPolicy says what happens to a request that carries a key (or
// needs one) when Options.Scope finds no principal for it.
type UnscopedPolicy uint8

const (
	// RejectUnscoped (the default) answers 401 with the problem type
	// ProblemScopeMissing (or the *Problem the Scope function returned),
	// and the handler does not run.
	RejectUnscoped UnscopedPolicy = iota
	// PassUnscoped runs the handler without idempotency: no record, no
	// replay. Never a shared "anonymous" namespace.
	PassUnscoped
)

// AfterCrashPolicy says what an attempt does when it takes over a key whose
// earlier attempt ran the handler and ended without recording its response
// or releasing the key: its process was killed while the handler (or a
// Proxy's upstream) ran, or it could not reach the store for the final
// write before its lease ran out. Whether that earlier run took effect is
// unknown.
type AfterCrashPolicy uint8

const (
	// RunAgainAfterCrash (the default of New) runs the handler again:
	// at least once. Right for handlers whose effects are themselves
	// idempotent (a database write keyed by Info.DeriveKey, a third-party
	// call that carries one).
	RunAgainAfterCrash AfterCrashPolicy = iota
	// AnswerUnknownAfterCrash makes a request run at most once across
	// crashes: before the handler runs, the attempt records a recovery
	// point under its fencing token (idem.Attempt.SaveStep), and an
	// attempt that takes over a key carrying such a point with no known
	// outcome does not run the handler but stores and answers 500
	// request-outcome-unknown (ProblemOutcomeUnknown; a Proxy answers 502
	// upstream-outcome-unknown), replayed to every retry. The point costs
	// one store write per executed request. A Proxy uses it unless its
	// UnknownOutcome is ReleaseUnknownOutcome.
	AnswerUnknownAfterCrash
)

// CompleteFailurePolicy says what the client gets when the handler ran but
// its response could not be recorded: the final write (Complete) failed and
// kept failing, retried with exponential backoff while the attempt still
// held its lease, until the lease was lost (another attempt took the key
// over, or no renewal reached the store for a whole Lease). It applies to
// responses still buffered by the middleware, that is responses within
// MaxResponseBytes that never called Flush; a response already streaming to
// the client is delivered as it is. Either way the record stays
// in_progress until its lease runs out; then a retry takes it over and,
// under RunAgainAfterCrash, runs the handler again (at least once), or,
// under AnswerUnknownAfterCrash, gets request-outcome-unknown.
type CompleteFailurePolicy uint8

const (
	// RespondUnavailable (the default) replaces the handler's response with
	// a 503 idempotency-unavailable problem, with Retry-After of the lease
	// (when a retry can take the key over) and Stripe-Should-Retry: true:
	// the client learns that the request ran and its outcome is not recorded;
	// its detail says what a retry with the key gets (a new run, or
	// request-outcome-unknown, by AfterCrash).
	RespondUnavailable CompleteFailurePolicy = iota
	// DeliverResponse sends the handler's response anyway.
	DeliverResponse
)

// Options configures a Middleware. Zero values take the documented
// defaults, except Namespace and Scope, which are mandatory.
type Options struct {
	// Namespace names the service (or API version) whose keys these are:
	// records live under the consumer name "idemhttp:"+Namespace, so two
	// services sharing a store never see each other's keys, and purging is
	// per namespace. Mandatory; 1 to MaxNamespaceLength bytes, no control
	// characters.
	Namespace string
	// Scope returns the principal or tenant of a request (an account ID, a
	// hash of the credentials): keys are unique per scope, so user B
	// never sees user A's response. Mandatory: New
	// returns ErrNoScope without it. It is called only for requests that
	// carry a key (or need one) with a covered method. An empty scope or
	// an error is handled by Unscoped; a returned *Problem is written as
	// it is. The scope is hashed (SHA-256) before it reaches the store.
	Scope func(r *http.Request) (string, error)
	// Unscoped is the policy for requests whose Scope is empty or failed.
	// Defaults to RejectUnscoped.
	Unscoped UnscopedPolicy

	// Methods are the methods the middleware applies to. Defaults to POST
	// and PATCH; other methods pass through, key or
	// not. GET, HEAD and OPTIONS always pass through, even if listed.
	Methods []string
	// RequireKey makes a missing key a 400 idempotency-key-missing on
	// every route wrapped by Wrap. Require does it for one route.
	RequireKey bool
	// StrictKey accepts only the RFC 9651 sf-string form of the key
	// ("..."). By default (lenient) a bare token or printable ASCII
	// without '"' and ',' is accepted too. See ParseKey.
	StrictKey bool
	// MaxKeyLength is the longest key accepted, in bytes. Defaults to
	// DefaultMaxKeyLength (255); it may be lower, never higher.
	MaxKeyLength int

	// CanonicalJSON fingerprints JSON request bodies (application/json and
	// +json media types) by their canonical form (idem.CanonicalJSON), so
	// a retry that re-serialises the same object with another key order or
	// whitespace still matches. Only bodies held in
	// memory (up to MemoryBodyBytes) are canonicalised; larger ones, and
	// bodies that are not valid JSON, are fingerprinted byte for byte.
	CanonicalJSON bool
	// MaxRequestBytes is the largest request body accepted, in bytes:
	// a larger one gets 413 request-body-too-large before the handler runs.
	// Defaults to DefaultMaxRequestBytes (10 MiB).
	MaxRequestBytes int64
	// MemoryBodyBytes is how much of a request body is held in memory
	// while it is fingerprinted; beyond it the body is spooled to a
	// temporary file in TempDir, removed when the request ends. Defaults
	// to DefaultMemoryBodyBytes (1 MiB).
	MemoryBodyBytes int64
	// TempDir is where large request bodies are spooled. Defaults to
	// os.TempDir().
	TempDir string

	// MaxResponseBytes is the largest response body stored for replay.
	// A larger response is sent to the client in full and its key is
	// completed but not replayable: a retry never runs the handler again
	// and gets 410 replay-unavailable. Defaults to
	// DefaultMaxResponseBytes (1 MiB).
	MaxResponseBytes int64
	// StoreSetCookie keeps Set-Cookie headers in the stored response, to be
	// replayed. By default they are dropped: a session cookie replayed to
	// a retry is rarely what anyone wants.
	StoreSetCookie bool
	// ReleaseStatus reports whether a response with this status releases
	// the key instead of being stored: the next retry runs the handler
	// again. Defaults to DefaultReleaseStatus (5xx, 408 and 429). To store
	// and replay 5xx too, pass a function that returns true only for 408
	// and 429. A handler can decide for one request with SetDisposition.
	ReleaseStatus func(status int) bool

	// Lease is how long a request owns its key; renewed every Lease/3
	// while the handler runs. Defaults to DefaultLease (30s); at least
	// idem.MinLease.
	Lease time.Duration
	// Wait makes a duplicate that arrives while the first request runs
	// wait up to this long for its response and replay it, instead of
	// getting 409 at once. Zero (the default) fails fast with 409.
	Wait time.Duration
	// InProgressRetryAfter is the Retry-After sent with 409
	// request-in-progress, rounded up to whole seconds (at least 1).
	// Defaults to DefaultInProgressRetryAfter (1s).
	InProgressRetryAfter time.Duration

	// FailOpen runs the handler without idempotency when the store is
	// unavailable, counted in Stats.FailOpen and logged. By default such a
	// request gets 503 idempotency-unavailable.
	FailOpen bool
	// UnavailableRetryAfter is the Retry-After sent with 503
	// idempotency-unavailable. Defaults to DefaultUnavailableRetryAfter.
	UnavailableRetryAfter time.Duration
	// CompleteFailure is the policy when the final write fails for good.
	// Defaults to RespondUnavailable.
	CompleteFailure CompleteFailurePolicy
	// AfterCrash is the policy for a key whose earlier attempt ran and
	// ended without recording its response (see AfterCrashPolicy).
	// Defaults to RunAgainAfterCrash (at least once); AnswerUnknownAfterCrash
	// gives at most once across crashes. NewProxy sets it from
	// ProxyOptions.UnknownOutcome.
	AfterCrash AfterCrashPolicy
	// StoreTimeout bounds each store call. Defaults to DefaultStoreTimeout.
	StoreTimeout time.Duration
	// Coalesce is the lease engine's idem.Config.Coalesce: over a store
	// with batches (idemdriver.LeaseBatcher), the most Acquire (or
	// Complete) calls of requests in flight at once that go to the store
	// together, in one round trip. 0 is idem's default (64, which cuts a
	// new key's Redis round trips from 2 to about 0.25 with 32 requests
	// in flight); 1 sends each call alone. Must be 0 to
	// idemdriver.MaxLeaseBatch.
	Coalesce int

	// Retention is how long completed keys are kept, in running time of
	// the namespace's middleware from the time the record was completed,
	// by the store's clock (idem.Purge: time in which no Middleware of the
	// namespace ran does not count, so a proxy that was down for a day
	// still replays the keys its clients retry after the downtime), and
	// enforced by purging (Purge, or the background loop). A key whose
	// record was purged is new again: a retry runs the handler. Defaults to
	// DefaultRetention (24h).
	Retention time.Duration
	// ReplayWindow, when positive, turns records older than it (measured
	// from the first request's arrival, by Now) into tombstones: a retry
	// gets 422 idempotency-key-expired instead of a replay, and never runs
	// the handler. Must not exceed Retention. Zero (the default) replays
	// until the record is purged.
	ReplayWindow time.Duration
	// PurgeInterval is the period of the background purge loop started by
	// New and stopped by Close, with 10% jitter. Defaults to
	// DefaultPurgeInterval (1h); a negative value disables the loop.
	PurgeInterval time.Duration
	// PurgeBatchSize is the most records one purge statement deletes.
	// Defaults to DefaultPurgeBatchSize.
	PurgeBatchSize int

	// Now is the clock used for record creation times and ReplayWindow.
	// Lease expiry and retention use the store's clock. Defaults to
	// time.Now.
	Now func() time.Time
	// Logger receives warnings (fail-open requests, failed final writes,
	// handler panics, purge errors) and hook panics. Defaults to
	// slog.Default().
	Logger *slog.Logger

	// Hooks observe the middleware with the core's hook interfaces
	// (idem.Hook: idem.HookProcessStart, idem.HookOutcome, ...), so that
	// idemotel's Observer, or idem.LogHook, works on HTTP requests as on
	// messages. A request on the idempotency path (a covered method with a
	// key, or a route that requires one) is one delivery in lease mode of
	// the consumer "idemhttp:"+Namespace, whose message ID is the record ID
	// (Middleware.RecordID: the hashed scope and the key; empty when the
	// key or the scope is invalid); the package doc maps each answer to
	// its events. Requests that pass through (no key on an optional route,
	// a method not covered, PassUnscoped) emit nothing. The start hook's
	// context is the handler's request context (a tracer's span is the
	// parent of the handler's spans). Hooks follow the core's rules: they
	// run synchronously on the request's goroutine (renewals on the
	// renewal goroutine), must be safe for concurrent use, and a panic in
	// one is recovered and logged at error level on Logger, and the
	// request goes on. New returns an error matching ErrInvalidOptions for
	// a hook that implements none of the interfaces. Defaults to none.
	Hooks []idem.Hook
}

// DefaultReleaseStatus is the default Options.ReleaseStatus: 5xx, 408
// (Request Timeout) and 429 (Too Many Requests) release the key, so the
// retry runs again (Stripe's rule: a
// server error is not a result). Every other
// status, 4xx included, is stored and replayed.
func DefaultReleaseStatus(status int) bool {
	return status >= 500 || status == http.StatusRequestTimeout || status == http.StatusTooManyRequests
}

// withDefaults returns a copy of o with defaults applied, or an error
// matching ErrInvalidOptions.
func (o Options) withDefaults() (Options, error) {
	if o.Scope == nil {
		return o, ErrNoScope
	}
	if err := keyed.CheckNamespace(consumerPrefix, o.Namespace, MaxNamespaceLength); err != nil {
		return o, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	if o.Unscoped > PassUnscoped {
		return o, fmt.Errorf("%w: unknown Unscoped policy %d", ErrInvalidOptions, o.Unscoped)
	}
	if o.AfterCrash > AnswerUnknownAfterCrash {
		return o, fmt.Errorf("%w: unknown AfterCrash policy %d", ErrInvalidOptions, o.AfterCrash)
	}
	if o.CompleteFailure > DeliverResponse {
		return o, fmt.Errorf("%w: unknown CompleteFailure policy %d", ErrInvalidOptions, o.CompleteFailure)
	}
	if len(o.Methods) == 0 {
		o.Methods = []string{http.MethodPost, http.MethodPatch}
	} else {
		o.Methods = slices.Clone(o.Methods)
		for _, m := range o.Methods {
			if m == "" || strings.ContainsAny(m, " \t\r\n") {
				return o, fmt.Errorf("%w: invalid method %q", ErrInvalidOptions, m)
			}
		}
	}
	if o.MaxKeyLength == 0 {
		o.MaxKeyLength = DefaultMaxKeyLength
	}
	if o.MaxKeyLength < 1 || o.MaxKeyLength > DefaultMaxKeyLength {
		return o, fmt.Errorf("%w: MaxKeyLength must be 1 to %d", ErrInvalidOptions, DefaultMaxKeyLength)
	}
	type dur struct {
		p    *time.Duration
		def  time.Duration
		name string
	}
	for _, d := range []dur{
		{&o.Lease, DefaultLease, "Lease"},
		{&o.InProgressRetryAfter, DefaultInProgressRetryAfter, "InProgressRetryAfter"},
		{&o.UnavailableRetryAfter, DefaultUnavailableRetryAfter, "UnavailableRetryAfter"},
		{&o.StoreTimeout, DefaultStoreTimeout, "StoreTimeout"},
		{&o.Retention, DefaultRetention, "Retention"},
	} {
		if *d.p == 0 {
			*d.p = d.def
		}
		if *d.p < 0 {
			return o, fmt.Errorf("%w: %s must be positive", ErrInvalidOptions, d.name)
		}
	}
	if o.Lease < idem.MinLease {
		return o, fmt.Errorf("%w: Lease must be at least %v", ErrInvalidOptions, idem.MinLease)
	}
	if o.Retention > idem.MaxRetentionWindow {
		return o, fmt.Errorf("%w: Retention must be at most %v", ErrInvalidOptions, idem.MaxRetentionWindow)
	}
	if o.Wait < 0 {
		return o, fmt.Errorf("%w: Wait must not be negative", ErrInvalidOptions)
	}
	if o.ReplayWindow < 0 || o.ReplayWindow > o.Retention {
		return o, fmt.Errorf("%w: ReplayWindow must be 0 to Retention", ErrInvalidOptions)
	}
	if o.PurgeInterval == 0 {
		o.PurgeInterval = DefaultPurgeInterval
	}
	if o.PurgeBatchSize == 0 {
		o.PurgeBatchSize = DefaultPurgeBatchSize
	}
	if o.PurgeBatchSize < 0 {
		return o, fmt.Errorf("%w: PurgeBatchSize must be positive", ErrInvalidOptions)
	}
	type size struct {
		p    *int64
		def  int64
		name string
	}
	for _, s := range []size{
		{&o.MaxRequestBytes, DefaultMaxRequestBytes, "MaxRequestBytes"},
		{&o.MemoryBodyBytes, DefaultMemoryBodyBytes, "MemoryBodyBytes"},
		{&o.MaxResponseBytes, DefaultMaxResponseBytes, "MaxResponseBytes"},
	} {
		if *s.p == 0 {
			*s.p = s.def
		}
		if *s.p < 0 {
			return o, fmt.Errorf("%w: %s must be positive", ErrInvalidOptions, s.name)
		}
	}
	if o.TempDir == "" {
		o.TempDir = os.TempDir()
	}
	if o.ReleaseStatus == nil {
		o.ReleaseStatus = DefaultReleaseStatus
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, nil
}

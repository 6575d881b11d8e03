package idemgrpc

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/internal/keyed"
)

// Errors returned by New. Both match idem.ErrInvalidConfig too.
var (
	// ErrInvalidOptions means an Options field is out of range or missing.
	ErrInvalidOptions = fmt.Errorf("idemgrpc: invalid options: %w", idem.ErrInvalidConfig)
	// ErrNoScope means Options.Scope is nil. Keys are always scoped to a
	// principal or tenant: one global namespace would let one caller
	// replay another's response, so there is no default.
	ErrNoScope = fmt.Errorf("%w: Scope is mandatory (keys are per principal or tenant, never global)", ErrInvalidOptions)
)

// Options configures a Server. Zero values take the documented defaults,
// except Namespace and Scope, which are mandatory.
type Options struct {
	// Namespace names the service whose keys these are: records live under
	// the consumer name "idemgrpc:"+Namespace, so two services sharing a
	// store never see each other's keys, and purging is per namespace.
	// Mandatory; 1 to idemhttp.MaxNamespaceLength bytes, no control characters.
	Namespace string
	// Scope returns the principal or tenant of a call (an account ID from
	// the authenticated peer or from the metadata your authentication
	// interceptor checked): keys are unique per scope, so caller B never
	// gets caller A's response. Mandatory: New returns ErrNoScope without
	// it. ctx is the call's server context (metadata.FromIncomingContext,
	// peer.FromContext, and whatever outer interceptors added). It is
	// called only for covered calls that carry a key (or need one). An
	// empty scope or an error is answered UNAUTHENTICATED, and the handler
	// does not run; an error that is a gRPC status is returned as it is.
	// The scope is hashed (SHA-256) before it reaches the store.
	Scope func(ctx context.Context) (string, error)
	// Methods reports whether the interceptor applies to a method (its
	// full name, "/package.Service/Method"). Defaults to every method:
	// list the mutating ones to leave reads alone.
	Methods func(fullMethod string) bool
	// RequireKey makes a covered call without the idempotency-key
	// metadata fail with INVALID_ARGUMENT (reason
	// IDEMPOTENCY_KEY_MISSING). By default such a call passes through,
	// unprotected.
	RequireKey bool
	// StrictKey accepts only the RFC 9651 sf-string form of the key
	// ("..."), as idemhttp.ParseKey does in strict mode. By default a bare
	// token (a UUID) is accepted too.
	StrictKey bool
	// MaxKeyLength is the longest key accepted, in bytes. Defaults to
	// idemhttp.DefaultMaxKeyLength (255); it may be lower, never higher.
	MaxKeyLength int

	// ReleaseCode reports whether a handler's status code releases the key
	// instead of being stored: the next retry runs the handler again.
	// Defaults to DefaultReleaseCode.
	ReleaseCode func(codes.Code) bool

	// Lease is how long a call owns its key; renewed every Lease/3 while
	// the handler runs. Defaults to idemhttp.DefaultLease; at least idem.MinLease.
	Lease time.Duration
	// Wait makes a duplicate that arrives while the first call runs wait
	// up to this long for its response and replay it, instead of getting
	// ABORTED at once. Zero (the default) fails fast.
	Wait time.Duration
	// InProgressRetryAfter is the RetryInfo delay sent with ABORTED
	// request-in-progress. Defaults to idemhttp.DefaultInProgressRetryAfter.
	InProgressRetryAfter time.Duration
	// FailOpen runs the handler without idempotency when the store is
	// unavailable, counted in Stats.FailOpen and logged. By default such
	// a call gets UNAVAILABLE.
	FailOpen bool
	// UnavailableRetryAfter is the RetryInfo delay sent with UNAVAILABLE
	// idempotency-unavailable. Defaults to idemhttp.DefaultUnavailableRetryAfter.
	UnavailableRetryAfter time.Duration
	// AfterCrash is the policy for a key whose earlier attempt ran the
	// handler and ended without recording its response (its process died,
	// or lost the store until its lease ran out), with idemhttp's meaning:
	// idemhttp.RunAgainAfterCrash (the default) runs the handler again,
	// at least once; idemhttp.AnswerUnknownAfterCrash records a recovery
	// point before each run and answers, and stores, UNKNOWN
	// request-outcome-unknown instead of running again: at most once.
	AfterCrash idemhttp.AfterCrashPolicy
	// StoreTimeout bounds each final store write. Defaults to
	// idemhttp.DefaultStoreTimeout.
	StoreTimeout time.Duration

	// Retention is how long completed keys are kept, in running time of
	// the namespace's servers (idem.Purge), enforced by Purge or the
	// background loop. Defaults to idemhttp.DefaultRetention (24h).
	Retention time.Duration
	// PurgeInterval is the period of the background purge loop started
	// by New and stopped by Close. Defaults to one hour; a negative value
	// disables the loop.
	PurgeInterval time.Duration
	// PurgeBatchSize is the most records one purge statement deletes.
	// Defaults to the core's default.
	PurgeBatchSize int

	// Logger receives warnings (fail-open calls, failed final writes,
	// handler panics). Defaults to slog.Default().
	Logger *slog.Logger
	// Hooks observe the interceptor with the core's hook interfaces
	// (idem.HookProcessStart, idem.HookOutcome, ...): a call on the
	// idempotency path is one lease-mode delivery of the consumer
	// "idemgrpc:"+Namespace whose message ID is the record ID
	// (Server.RecordID), reported by the core's lease engine.
	Hooks []idem.Hook
}

// DefaultReleaseCode is the default Options.ReleaseCode. It mirrors the
// HTTP middleware's rule (5xx, 408 and 429 release; Stripe's "a server
// error is not a result") through the HTTP mapping of google.rpc.Code:
// UNKNOWN, INTERNAL, DATA_LOSS (500), UNIMPLEMENTED (501), UNAVAILABLE
// (503), DEADLINE_EXCEEDED (504) and RESOURCE_EXHAUSTED (429) release the
// key. So do CANCELLED (the caller left: not a result) and ABORTED (a
// concurrency conflict: gRPC's guidance says the operation did not take
// effect, and Stripe saves no result for a request that conflicted with
// another). Every other code (OK, INVALID_ARGUMENT, NOT_FOUND,
// ALREADY_EXISTS, PERMISSION_DENIED, UNAUTHENTICATED, FAILED_PRECONDITION,
// OUT_OF_RANGE) is stored and replayed, errors included.
func DefaultReleaseCode(c codes.Code) bool {
	switch c {
	case codes.Canceled, codes.Unknown, codes.DeadlineExceeded, codes.ResourceExhausted,
		codes.Aborted, codes.Unimplemented, codes.Internal, codes.Unavailable, codes.DataLoss:
		return true
	}
	return false
}

// withDefaults returns a copy of o with defaults applied, or an error
// matching ErrInvalidOptions.
func (o Options) withDefaults() (Options, error) {
	if o.Scope == nil {
		return o, ErrNoScope
	}
	if err := keyed.CheckNamespace(consumerPrefix, o.Namespace, idemhttp.MaxNamespaceLength); err != nil {
		return o, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	if o.AfterCrash > idemhttp.AnswerUnknownAfterCrash {
		return o, fmt.Errorf("%w: unknown AfterCrash policy %d", ErrInvalidOptions, o.AfterCrash)
	}
	if o.MaxKeyLength == 0 {
		o.MaxKeyLength = idemhttp.DefaultMaxKeyLength
	}
	if o.MaxKeyLength < 1 || o.MaxKeyLength > idemhttp.DefaultMaxKeyLength {
		return o, fmt.Errorf("%w: MaxKeyLength must be 1 to %d", ErrInvalidOptions, idemhttp.DefaultMaxKeyLength)
	}
	for _, d := range []struct {
		p    *time.Duration
		def  time.Duration
		name string
	}{
		{&o.Lease, idemhttp.DefaultLease, "Lease"},
		{&o.InProgressRetryAfter, idemhttp.DefaultInProgressRetryAfter, "InProgressRetryAfter"},
		{&o.UnavailableRetryAfter, idemhttp.DefaultUnavailableRetryAfter, "UnavailableRetryAfter"},
		{&o.StoreTimeout, idemhttp.DefaultStoreTimeout, "StoreTimeout"},
		{&o.Retention, idemhttp.DefaultRetention, "Retention"},
	} {
		if *d.p == 0 {
			*d.p = d.def
		}
		if *d.p < 0 {
			return o, fmt.Errorf("%w: %s must be positive", ErrInvalidOptions, d.name)
		}
	}
	if o.Wait < 0 || o.PurgeBatchSize < 0 {
		return o, fmt.Errorf("%w: Wait and PurgeBatchSize must not be negative", ErrInvalidOptions)
	}
	if o.Methods == nil {
		o.Methods = func(string) bool { return true }
	}
	if o.ReleaseCode == nil {
		o.ReleaseCode = DefaultReleaseCode
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, nil
}

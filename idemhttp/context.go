package idemhttp

import (
	"context"
	"sync/atomic"

	"github.com/idem-go/idem"
)

// Info describes the idempotent attempt a handler is running, read from
// the request context with FromContext.
type Info struct {
	// Key is the client's Idempotency-Key, decoded.
	Key string
	// Scope is what Options.Scope returned for the request.
	Scope string
	// Namespace is Options.Namespace.
	Namespace string
	// Consumer and RecordID are the store record's identity: Consumer is
	// "idemhttp:"+Namespace, RecordID is derived from Scope and Key (see
	// Middleware.RecordID).
	Consumer, RecordID string
	// Attempt is the attempt number: 1 for the first run of this key, one
	// more for each later run (after a released response, or a takeover
	// of a crashed attempt's expired lease).
	Attempt int
	// Token is the attempt's fencing token: strictly increasing with every
	// attempt at this key. Pass it to a system that can reject writes
	// from a stale owner.
	Token int64

	disp    *atomic.Int32
	abort   *atomic.Pointer[Problem] // set by abortWith
	attempt *idem.Attempt
}

// AttemptFromContext returns the lease-engine attempt that holds the key
// of the request whose handler received ctx, so the handler can check its
// lease before an effect that must not run twice (Attempt.Valid, by the
// store's clock and the local deadline; Attempt.Deadline), record its own
// recovery points (Attempt.Step, Attempt.SaveStep) or watch
// Attempt.LeaseContext. The handler must not end the attempt (Complete,
// Release, Abandon): the Middleware does when the handler returns. False
// when the request is not on the idempotency path.
func AttemptFromContext(ctx context.Context) (*idem.Attempt, bool) {
	i, ok := ctx.Value(infoKey{}).(*Info)
	if !ok || i.attempt == nil {
		return nil, false
	}
	return i.attempt, true
}

// DeriveKey returns a key for one call this handler makes to a third party
// (Stripe's Idempotency-Key, an email provider's dedupe ID): identical on
// every attempt at this scope and key, distinct per step, and revealing
// neither. It is idem.DeriveKey(Consumer, RecordID, step): "idem-" and 64
// hex digits.
func (i Info) DeriveKey(step string) string {
	return idem.DeriveKey(i.Consumer, i.RecordID, step)
}

type infoKey struct{}

// FromContext returns the Info of the idempotent attempt whose handler
// received ctx (the request's context, or one derived from it); false
// when the request did not go through a Middleware's idempotency path
// (a pass-through method, no key on an optional route, fail-open).
func FromContext(ctx context.Context) (Info, bool) {
	i, ok := ctx.Value(infoKey{}).(*Info)
	if !ok {
		return Info{}, false
	}
	return *i, true
}

// Disposition overrides, for one request, whether its response is stored
// or releases the key (see SetDisposition).
type Disposition int32

const (
	// DispositionDefault applies Options.ReleaseStatus to the status.
	DispositionDefault Disposition = iota
	// DispositionStore stores the response whatever its status, so every
	// retry replays it (a reverse proxy uses it for an
	// upstream-outcome-unknown answer: the request may have been executed).
	DispositionStore
	// DispositionRelease releases the key whatever the status, so the
	// retry runs the handler again (the handler knows no side effect
	// happened).
	DispositionRelease
)

// SetDisposition decides, from inside a handler, whether this request's
// response is stored (DispositionStore) or releases the key
// (DispositionRelease), overriding Options.ReleaseStatus. ctx is the
// request's context. It reports false, and does nothing, when the request
// is not on the idempotency path or d is unknown. The last call before
// the handler returns wins.
func SetDisposition(ctx context.Context, d Disposition) bool {
	i, ok := ctx.Value(infoKey{}).(*Info)
	if !ok || i.disp == nil || d < DispositionDefault || d > DispositionRelease {
		return false
	}
	i.disp.Store(int32(d))
	return true
}

// abortWith tells the middleware, from inside the handler, that the
// response it streamed is broken: the client's connection is to be
// aborted (so a short body is never taken as complete) and, when the key
// is stored (see SetDisposition), p is stored in the response's place, so
// retries get p. It reports whether ctx carries a middleware's Info.
func abortWith(ctx context.Context, p *Problem) bool {
	i, ok := ctx.Value(infoKey{}).(*Info)
	if !ok || i.abort == nil || p == nil {
		return false
	}
	i.abort.Store(p)
	return true
}

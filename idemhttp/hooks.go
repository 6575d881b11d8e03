package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/idem-go/idem"
)

// hooks is the set of Options.Hooks of one Middleware, sorted by interface
// at construction (as the core sorts idem.Config.Hooks). A Middleware
// without hooks has a nil *hooks and builds no events.
type hooks struct {
	consumer string
	log      *slog.Logger

	start    []idem.HookProcessStart
	end      []idem.HookProcessEnd
	claim    []idem.HookClaim
	outcome  []idem.HookOutcome
	renewed  []idem.HookLeaseRenewed
	takeover []idem.HookLeaseTakenOver
	lost     []idem.HookLeaseLost
	purge    []idem.HookPurge
	storeErr []idem.HookStoreError
}

// newHooks sorts hs by interface; nil for no hooks, and an error matching
// ErrInvalidOptions for a hook that implements none of the interfaces.
func newHooks(hs []idem.Hook, consumer string, log *slog.Logger) (*hooks, error) {
	if len(hs) == 0 {
		return nil, nil
	}
	h := &hooks{consumer: consumer, log: log}
	for i, x := range hs {
		n := 0
		if v, ok := x.(idem.HookProcessStart); ok {
			h.start, n = append(h.start, v), n+1
		}
		if v, ok := x.(idem.HookProcessEnd); ok {
			h.end, n = append(h.end, v), n+1
		}
		if v, ok := x.(idem.HookClaim); ok {
			h.claim, n = append(h.claim, v), n+1
		}
		if v, ok := x.(idem.HookOutcome); ok {
			h.outcome, n = append(h.outcome, v), n+1
		}
		if v, ok := x.(idem.HookLeaseRenewed); ok {
			h.renewed, n = append(h.renewed, v), n+1
		}
		if v, ok := x.(idem.HookLeaseTakenOver); ok {
			h.takeover, n = append(h.takeover, v), n+1
		}
		if v, ok := x.(idem.HookLeaseLost); ok {
			h.lost, n = append(h.lost, v), n+1
		}
		if v, ok := x.(idem.HookPurge); ok {
			h.purge, n = append(h.purge, v), n+1
		}
		if v, ok := x.(idem.HookStoreError); ok {
			h.storeErr, n = append(h.storeErr, v), n+1
		}
		if n == 0 {
			return nil, fmt.Errorf("%w: Hooks[%d] (%T) implements none of the idem.Hook* interfaces", ErrInvalidOptions, i, x)
		}
	}
	return h, nil
}

// safe calls fn, recovering and logging a panic of hook (the core's rule:
// a hook never changes processing).
func (h *hooks) safe(hook any, fn func()) {
	defer func() {
		if r := recover(); r != nil {
			h.log.Error("idemhttp: hook panicked; the request goes on", "consumer", h.consumer,
				"hook", fmt.Sprintf("%T", hook), "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
		}
	}()
	fn()
}

// errNoOutcome is the error of the Failed outcome reported for a request
// whose serving panicked before it was settled (a store or a ResponseWriter
// that panics); the panic goes on to net/http.
var errNoOutcome = errors.New("idemhttp: the request ended in a panic before its outcome was known")

// reqTrack follows one request on the idempotency path for the hooks.
// Every method of a nil *reqTrack does nothing, so the serving code calls
// them unconditionally.
type reqTrack struct {
	h     *hooks
	ctx   context.Context // returned by the start hooks
	id    string          // record ID; "" when the key or the scope is invalid
	start time.Time

	attempt  int
	token    int64
	claimed  bool
	released bool

	settled bool
	out     idem.Outcome
	reason  idem.DuplicateReason
	code    int
}

// begin runs the start hooks for a request on the idempotency path and
// returns the context for the rest of it (the handler's included) and its
// tracker; ctx and nil when the Middleware has no hooks.
func (m *Middleware) begin(ctx context.Context, id string) (context.Context, *reqTrack) {
	h := m.hooks
	if h == nil {
		return ctx, nil
	}
	t := &reqTrack{h: h, id: id, start: time.Now()}
	for _, x := range h.start {
		h.safe(x, func() {
			if nctx := x.OnProcessStart(ctx, idem.ProcessStartEvent{Consumer: h.consumer, Mode: idem.ModeLease, MessageID: id}); nctx != nil {
				ctx = nctx
			}
		})
	}
	t.ctx = ctx
	return ctx, t
}

// settle sets the request's outcome, reported when the request ends; code
// is the HTTP status written (0: none). The last call wins.
func (t *reqTrack) settle(out idem.Outcome, reason idem.DuplicateReason, code int) {
	if t == nil {
		return
	}
	out.MessageID = t.id
	if out.Attempt == 0 {
		out.Attempt = t.attempt
	}
	t.out, t.reason, t.code, t.settled = out, reason, code, true
}

// claimedKey reports the acquisition of the key by this request, made in
// the Acquire call that started at since, and a takeover when it is not
// the first attempt.
func (t *reqTrack) claimedKey(attempt int, token int64, since time.Time) {
	if t == nil {
		return
	}
	t.claimed, t.attempt, t.token = true, attempt, token
	h, lat := t.h, time.Since(since)
	for _, x := range h.claim {
		h.safe(x, func() {
			x.OnClaim(t.ctx, idem.ClaimEvent{Consumer: h.consumer, MessageID: t.id, Mode: idem.ModeLease, Attempt: attempt, Token: token, Latency: lat})
		})
	}
	if attempt > 1 {
		e := idem.LeaseEvent{Consumer: h.consumer, MessageID: t.id, Attempt: attempt, Token: token, Latency: lat}
		for _, x := range h.takeover {
			h.safe(x, func() { x.OnLeaseTakenOver(t.ctx, e) })
		}
	}
}

// renewed reports a successful renewal that took lat.
func (t *reqTrack) renewed(ctx context.Context, lat time.Duration) {
	if t == nil {
		return
	}
	h := t.h
	e := idem.LeaseEvent{Consumer: h.consumer, MessageID: t.id, Attempt: t.attempt, Token: t.token, Latency: lat}
	for _, x := range h.renewed {
		h.safe(x, func() { x.OnLeaseRenewed(ctx, e) })
	}
}

// leaseLost reports a write (op: "renew", "complete" or "release")
// rejected with idem.ErrLeaseLost.
func (t *reqTrack) leaseLost(ctx context.Context, op string, lat time.Duration, err error) {
	if t == nil {
		return
	}
	h := t.h
	e := idem.LeaseEvent{Consumer: h.consumer, MessageID: t.id, Attempt: t.attempt, Token: t.token, Op: op, Latency: lat, Err: err}
	for _, x := range h.lost {
		h.safe(x, func() { x.OnLeaseLost(ctx, e) })
	}
}

// end reports the request's outcome and the end of its processing. It is
// deferred by serve, so a request that panics (a handler's
// http.ErrAbortHandler, or a store that panics) is reported too.
func (t *reqTrack) end() {
	lat := time.Since(t.start)
	if !t.settled {
		t.out = idem.Outcome{Status: idem.Failed, MessageID: t.id, Err: errNoOutcome, Attempt: t.attempt}
	}
	h := t.h
	e := idem.OutcomeEvent{
		Outcome: t.out, Consumer: h.consumer, Mode: idem.ModeLease, Reason: t.reason,
		Claimed: t.claimed, Released: t.claimed && t.released, Latency: lat, HTTPStatus: t.code,
	}
	for _, x := range h.outcome {
		h.safe(x, func() { x.OnOutcome(t.ctx, e) })
	}
	var err error
	if !t.out.Ack() {
		err = t.out.Err
	}
	ee := idem.ProcessEndEvent{Consumer: h.consumer, Mode: idem.ModeLease, MessageID: t.id, Latency: lat, Err: err}
	for _, x := range h.end {
		h.safe(x, func() { x.OnProcessEnd(t.ctx, ee) })
	}
}

// storeErr wraps err, from the store call op made for the record id, with
// idem.ErrStore and reports it to the store error hooks, unless ctx (the
// context the call was derived from) has ended: the failure is then the
// client's departure, not the store's.
func (m *Middleware) storeErr(ctx context.Context, op, id string, err error) error {
	if err == nil {
		return nil
	}
	if !errors.Is(err, idem.ErrStore) {
		err = fmt.Errorf("%w: %s: %w", idem.ErrStore, op, err)
	}
	if h := m.hooks; h != nil && len(h.storeErr) > 0 && ctx.Err() == nil {
		e := idem.StoreErrorEvent{Consumer: h.consumer, MessageID: id, Mode: idem.ModeLease, Op: op, Err: err}
		for _, x := range h.storeErr {
			h.safe(x, func() { x.OnStoreError(ctx, e) })
		}
	}
	return err
}

// trackID returns the record ID of t's request, "" for a nil t.
func (t *reqTrack) trackID() string {
	if t == nil {
		return ""
	}
	return t.id
}

// purged reports a purge to the purge hooks.
func (m *Middleware) purged(ctx context.Context, res idem.PurgeResult, err error, lat time.Duration) {
	h := m.hooks
	if h == nil || len(h.purge) == 0 {
		return
	}
	e := idem.PurgeEvent{Consumer: m.consumer, Result: res, RetentionWindow: m.o.Retention, Latency: lat, Err: err}
	if err == nil && !res.Horizon.IsZero() {
		e.Lag = max(0, time.Since(res.Horizon)-m.o.Retention)
	}
	for _, x := range h.purge {
		h.safe(x, func() { x.OnPurge(ctx, e) })
	}
}

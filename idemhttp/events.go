package idemhttp

import (
	"context"
	"fmt"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/idem-go/idem"
)

// HookResponse observes the answers of a Middleware: the HTTP side of a
// request on the idempotency path, which the core's hooks (idem.Hook, in
// Options.Hooks too) see as one lease-mode delivery without its HTTP
// status. It is called once per request on the idempotency path (a
// covered method with a key, or a route that requires one), when the
// request's serving ends, after the core's idem.HookOutcome and
// idem.HookProcessEnd calls of the same request, with the request's
// context. Like the core's hooks it runs synchronously, must be fast and
// safe for concurrent use, and a panic in it is recovered and logged.
type HookResponse interface {
	OnResponse(ctx context.Context, e ResponseEvent)
}

// ResponseEvent reports the answer one request on the idempotency path got.
type ResponseEvent struct {
	// Consumer is the Middleware's consumer name, "idemhttp:"+Namespace.
	Consumer string
	// RecordID is the key's record ID (Middleware.RecordID); empty when the
	// key or the scope is invalid.
	RecordID string
	// Status is the HTTP status code written; 0 when none was (the client
	// left while waiting, the connection was aborted, or a fail-open
	// request ran unprotected and its status is the handler's business).
	Status int
	// Outcome is the status of the core's outcome of the delivery
	// (idem.Processed, idem.Duplicate, ...); 0 for a request answered
	// before its key reached the store (invalid or missing key, no scope,
	// body refused), which the core's hooks do not see.
	Outcome idem.Status
	// Problem is the problem type of an answer the middleware wrote itself
	// (one of the Problem* constants); empty for the handler's response
	// and for replays.
	Problem string
	// Replayed is true when a stored response was replayed
	// (Idempotent-Replayed: true).
	Replayed bool
	// Executed is true when the handler ran for this request.
	Executed bool
	// FailOpen is true when the handler ran without idempotency because
	// the store was unavailable (Options.FailOpen).
	FailOpen bool
	// Attempt is the attempt number of a request that acquired its key, 0
	// otherwise.
	Attempt int
	// Latency is the time from the start of the idempotency path to the end.
	Latency time.Duration
	// Method is the request's method (http.Request.Method).
	Method string
	// Route is the path pattern of the http.ServeMux route the request
	// matched (http.Request.Pattern without its method and host, e.g.
	// "/orders/{id}"); empty when no ServeMux routed the request before the
	// middleware (a middleware around the mux, or the proxy).
	Route string
}

// respTrack builds the ResponseEvent of one request. Its methods do
// nothing on a nil *respTrack (a Middleware without HookResponse hooks).
type respTrack struct {
	m     *Middleware
	ctx   context.Context
	start time.Time
	ResponseEvent
	attempt int
}

// track starts the event of a request on the idempotency path.
func (m *Middleware) track(r *http.Request, id string) *respTrack {
	if len(m.resp) == 0 {
		return nil
	}
	return &respTrack{m: m, ctx: r.Context(), start: time.Now(),
		ResponseEvent: ResponseEvent{Consumer: m.consumer, RecordID: id, Method: r.Method, Route: route(r.Pattern)}}
}

func (t *respTrack) outcome(out idem.Outcome) {
	if t != nil {
		t.Outcome = out.Status
	}
}

func (t *respTrack) acquired(attempt int) {
	if t != nil {
		t.attempt = attempt
	}
}

func (t *respTrack) problem(p *Problem) {
	if t != nil {
		t.Status, t.Problem = p.Status, p.Type
	}
}

func (t *respTrack) replayed(status int) {
	if t != nil {
		t.Status, t.Replayed = status, true
	}
}

// handler records the handler's response (aborted: the connection was
// aborted, no status reached the client as complete).
func (t *respTrack) handler(status int, aborted bool) {
	if t != nil {
		t.Status, t.Executed = status, true
		if aborted {
			t.Status = 0
		}
	}
}

func (t *respTrack) aborted() {
	if t != nil {
		t.Status, t.Executed = 0, true
	}
}

func (t *respTrack) failOpen() {
	if t != nil {
		t.FailOpen, t.Executed = true, true
	}
}

// emit calls the HookResponse hooks; deferred by serve, so a request that
// panics (http.ErrAbortHandler) is reported too.
func (t *respTrack) emit() {
	t.Attempt = t.attempt
	t.Latency = time.Since(t.start)
	for _, h := range t.m.resp {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.m.o.Logger.Error("idemhttp: hook panicked; the request goes on", "consumer", t.Consumer,
						"hook", fmt.Sprintf("%T", h), "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
				}
			}()
			h.OnResponse(t.ctx, t.ResponseEvent)
		}()
	}
}

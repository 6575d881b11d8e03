package idemhttp

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ProblemTypeBase prefixes every problem type URI of this package: the
// section of the repository's docs/problems.md (shipped with the
// module's source) that documents the type, one section per type named
// after it ("...problems.md#request-in-progress").
const ProblemTypeBase = "https://github.com/idem-go/idem/blob/main/docs/problems.md#"

// Problem type URIs, one per condition (RFC 9457 "type"). Clients branch on
// them (or on their suffix), never on the title or detail.
const (
	// ProblemKeyMissing: 400, a route that requires a key got none.
	ProblemKeyMissing = ProblemTypeBase + "idempotency-key-missing"
	// ProblemKeyInvalid: 400, the Idempotency-Key header is malformed,
	// empty, too long, or sent on several field lines.
	ProblemKeyInvalid = ProblemTypeBase + "idempotency-key-invalid"
	// ProblemKeyReused: 422, the key was used with another request
	// (method, path, query, media type or body differ).
	ProblemKeyReused = ProblemTypeBase + "idempotency-key-reused"
	// ProblemKeyExpired: 422, the key's replay window is over
	// (Options.ReplayWindow, tombstone mode).
	ProblemKeyExpired = ProblemTypeBase + "idempotency-key-expired"
	// ProblemInProgress: 409 with Retry-After, a request with this key is
	// still running. Retry with the same key.
	ProblemInProgress = ProblemTypeBase + "request-in-progress"
	// ProblemUnavailable: 503 with Retry-After, the idempotency store could
	// not be reached (or the final write failed). Retry with the same key.
	ProblemUnavailable = ProblemTypeBase + "idempotency-unavailable"
	// ProblemReplayUnavailable: 410, the request was processed but its
	// response was too large to store; it is not executed again.
	ProblemReplayUnavailable = ProblemTypeBase + "replay-unavailable"
	// ProblemRecordCorrupt: 500, the stored record of this key cannot be
	// decoded; the handler is not run (a corrupt record is never treated
	// as absent).
	ProblemRecordCorrupt = ProblemTypeBase + "idempotency-record-corrupt"
	// ProblemBodyTooLarge: 413, the request body exceeds
	// Options.MaxRequestBytes.
	ProblemBodyTooLarge = ProblemTypeBase + "request-body-too-large"
	// ProblemBodyUnreadable: 400, the request body could not be read.
	ProblemBodyUnreadable = ProblemTypeBase + "request-body-unreadable"
	// ProblemScopeMissing: 401, no principal or tenant could be found for
	// a request that carries a key (Options.Unscoped = RejectUnscoped).
	ProblemScopeMissing = ProblemTypeBase + "idempotency-scope-missing"
	// ProblemHandlerPanic: 500, the handler panicked before writing a
	// response; the key was released.
	ProblemHandlerPanic = ProblemTypeBase + "handler-panic"
	// ProblemLeaseLost: 409 with Retry-After, the request ran but another
	// attempt took the key over before its response was recorded; a
	// retry sees what the other attempt did.
	ProblemLeaseLost = ProblemTypeBase + "idempotency-lease-lost"
	// ProblemOutcomeUnknown: 500, an earlier attempt with this key ran the
	// handler and ended without recording its response (its process was
	// killed, or it lost the store before the final write), so whether it
	// took effect is unknown; under AnswerUnknownAfterCrash the request
	// is not run again and this answer is stored and replayed to every
	// retry. Find the outcome another way (a GET on the resource).
	ProblemOutcomeUnknown = ProblemTypeBase + "request-outcome-unknown"
)

// HeaderShouldRetry is Stripe's response header telling its client
// libraries whether to retry ("true") or not ("false"), whatever the
// status; the middleware's own answers carry it (see Problem.Write).
const HeaderShouldRetry = "Stripe-Should-Retry"

// Sentinel errors, one per problem type: a *Problem written by the
// middleware wraps the matching one, so Go code branches with errors.Is.
var (
	ErrKeyMissing        = errors.New("idemhttp: idempotency key missing")
	ErrKeyInvalid        = errors.New("idemhttp: idempotency key invalid")
	ErrKeyReused         = errors.New("idemhttp: idempotency key reused with another request")
	ErrKeyExpired        = errors.New("idemhttp: idempotency key expired")
	ErrInProgress        = errors.New("idemhttp: request in progress")
	ErrUnavailable       = errors.New("idemhttp: idempotency store unavailable")
	ErrReplayUnavailable = errors.New("idemhttp: response not replayable")
	ErrRecordCorrupt     = errors.New("idemhttp: stored record corrupt")
	ErrBodyTooLarge      = errors.New("idemhttp: request body too large")
	ErrBodyUnreadable    = errors.New("idemhttp: request body unreadable")
	ErrScopeMissing      = errors.New("idemhttp: no scope for request")
	ErrHandlerPanic      = errors.New("idemhttp: handler panicked")
	ErrLeaseLost         = errors.New("idemhttp: lease lost before the response was recorded")
	ErrOutcomeUnknown    = errors.New("idemhttp: outcome of an earlier attempt unknown")
	// ErrHijackNotSupported is returned by Hijack on the ResponseWriter the
	// middleware gives a handler: a hijacked connection (a WebSocket
	// upgrade) has no response to record, so protected routes refuse it.
	// Exclude such routes from the middleware instead. The attempt's key
	// is released, whatever the handler writes afterwards.
	ErrHijackNotSupported = errors.New("idemhttp: Hijack is not supported on an idempotency-protected route")
)

// problemErrs maps each problem type to its sentinel.
var problemErrs = map[string]error{
	ProblemKeyMissing:        ErrKeyMissing,
	ProblemKeyInvalid:        ErrKeyInvalid,
	ProblemKeyReused:         ErrKeyReused,
	ProblemKeyExpired:        ErrKeyExpired,
	ProblemInProgress:        ErrInProgress,
	ProblemUnavailable:       ErrUnavailable,
	ProblemReplayUnavailable: ErrReplayUnavailable,
	ProblemRecordCorrupt:     ErrRecordCorrupt,
	ProblemBodyTooLarge:      ErrBodyTooLarge,
	ProblemBodyUnreadable:    ErrBodyUnreadable,
	ProblemScopeMissing:      ErrScopeMissing,
	ProblemHandlerPanic:      ErrHandlerPanic,
	ProblemLeaseLost:         ErrLeaseLost,
	ProblemOutcomeUnknown:    ErrOutcomeUnknown,
}

// retryableProblems are the problem types a retry with the same key can
// change: the request is running (409), the store is unreachable (503),
// another attempt took the key over (409), the handler panicked and its
// key was released (500), nothing reached the upstream (502). Every other
// answer is final for the key, or for the request as sent.
var retryableProblems = map[string]bool{
	ProblemInProgress:          true,
	ProblemUnavailable:         true,
	ProblemLeaseLost:           true,
	ProblemHandlerPanic:        true,
	ProblemUpstreamUnavailable: true,
}

// Problem is an RFC 9457 problem detail, the body of every error response
// the middleware writes itself (as application/problem+json with
// Cache-Control: no-store; never stored, never replayed). It is also an
// error: it matches the sentinel of its type (ErrKeyInvalid for
// ProblemKeyInvalid, ...) and unwraps to Err.
type Problem struct {
	// Type is the problem type URI, e.g. ProblemInProgress.
	Type string `json:"type"`
	// Title is a short human-readable summary of the type.
	Title string `json:"title"`
	// Status is the HTTP status code.
	Status int `json:"status"`
	// Detail explains this occurrence.
	Detail string `json:"detail,omitempty"`
	// RetryAfter, when positive, is sent as the Retry-After header, in
	// whole seconds rounded up; not part of the JSON body.
	RetryAfter time.Duration `json:"-"`
	// Err is the cause, for Go callers; not part of the JSON body.
	Err error `json:"-"`

	final bool // no retry can change it, whatever its type
}

// Error implements error.
func (p *Problem) Error() string {
	s := fmt.Sprintf("idemhttp: %d %s", p.Status, p.Title)
	if p.Detail != "" {
		s += ": " + p.Detail
	}
	return s
}

// Unwrap returns the cause.
func (p *Problem) Unwrap() error { return p.Err }

// Is reports whether target is the sentinel of p's type.
func (p *Problem) Is(target error) bool {
	s, ok := problemErrs[p.Type]
	return ok && s == target
}

// Write writes p to w as application/problem+json, with Cache-Control:
// no-store, Retry-After when p.RetryAfter is positive, and
// Stripe-Should-Retry (HeaderShouldRetry): "true" for the answers a retry
// with the same key can change (409 request-in-progress and
// idempotency-lease-lost, 503 idempotency-unavailable, 500 handler-panic,
// 502 upstream-unavailable), "false" for every other one (400, 401, 410,
// 413, 422, outcome-unknown), so Stripe's clients stop at once. The final
// answers carry no Retry-After either, which is what clients following
// RFC 9110 (urllib3's Retry, for one) need to stop; the IETF draft calls
// them client errors that the client must not retry unchanged.
func (p *Problem) Write(w http.ResponseWriter) {
	body, err := json.Marshal(p)
	if err != nil { // cannot happen: strings and an int
		body = []byte(`{"type":"about:blank","status":500}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Del(HeaderReplayed)
	h.Set(HeaderShouldRetry, strconv.FormatBool(retryableProblems[p.Type] && !p.final))
	if p.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(retryAfterSeconds(p.RetryAfter), 10))
	}
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}

// retryAfterSeconds rounds d up to whole seconds, at least 1.
func retryAfterSeconds(d time.Duration) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	return max(s, 1)
}

// ReadProblem decodes the problem detail of resp when its Content-Type is
// application/problem+json, reading at most 64 KiB of the body (which the
// caller still closes). It returns an error otherwise. RetryAfter is
// filled from a Retry-After header in seconds, and Err from the type.
func ReadProblem(resp *http.Response) (*Problem, error) {
	mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if err != nil || mt != "application/problem+json" {
		return nil, fmt.Errorf("idemhttp: not a problem response (Content-Type %q)", resp.Header.Get("Content-Type"))
	}
	var p Problem
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&p); err != nil {
		return nil, fmt.Errorf("idemhttp: decode problem: %w", err)
	}
	if s, err := strconv.ParseInt(strings.TrimSpace(resp.Header.Get("Retry-After")), 10, 64); err == nil && s > 0 {
		p.RetryAfter = time.Duration(s) * time.Second
	}
	p.Err = problemErrs[p.Type]
	return &p, nil
}

// newProblem returns the problem of type typ with its standard status and
// title.
func newProblem(typ, detail string) *Problem {
	p := &Problem{Type: typ, Detail: detail, Err: problemErrs[typ]}
	switch typ {
	case ProblemKeyMissing:
		p.Status, p.Title = http.StatusBadRequest, "Idempotency-Key header missing"
	case ProblemKeyInvalid:
		p.Status, p.Title = http.StatusBadRequest, "Idempotency-Key header invalid"
	case ProblemKeyReused:
		p.Status, p.Title = http.StatusUnprocessableEntity, "Idempotency-Key reused with another request"
	case ProblemKeyExpired:
		p.Status, p.Title = http.StatusUnprocessableEntity, "Idempotency-Key expired"
	case ProblemInProgress:
		p.Status, p.Title = http.StatusConflict, "A request with this Idempotency-Key is in progress"
	case ProblemUnavailable:
		p.Status, p.Title = http.StatusServiceUnavailable, "Idempotency store unavailable"
	case ProblemReplayUnavailable:
		p.Status, p.Title = http.StatusGone, "Response not replayable"
	case ProblemRecordCorrupt:
		p.Status, p.Title = http.StatusInternalServerError, "Idempotency record unreadable"
	case ProblemBodyTooLarge:
		p.Status, p.Title = http.StatusRequestEntityTooLarge, "Request body too large"
	case ProblemBodyUnreadable:
		p.Status, p.Title = http.StatusBadRequest, "Request body unreadable"
	case ProblemScopeMissing:
		p.Status, p.Title = http.StatusUnauthorized, "No principal for an idempotent request"
	case ProblemHandlerPanic:
		p.Status, p.Title = http.StatusInternalServerError, "Internal server error"
	case ProblemLeaseLost:
		p.Status, p.Title = http.StatusConflict, "Idempotency-Key taken over by another attempt"
	case ProblemOutcomeUnknown:
		p.Status, p.Title = http.StatusInternalServerError, "Outcome of an earlier attempt unknown"
	default:
		p.Status, p.Title = http.StatusInternalServerError, "Internal server error"
	}
	return p
}

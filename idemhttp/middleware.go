package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime/debug"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/keyed"
)

// consumerPrefix starts the consumer name of every record of this package.
const consumerPrefix = "idemhttp:"

// Middleware is idempotency-key middleware for net/http over an
// idemdriver.LeaseStore (memory, PostgreSQL, MariaDB/MySQL, SQLite or Redis).
// See the package documentation for its semantics. It runs each keyed
// request as one attempt of an idem.LeaseConsumer (the lease engine of
// package idem: the lease, its renewal, recovery points, completion,
// release, retention and the core's hooks), adding the HTTP semantics:
// keys, scope, fingerprint, recording, replay and problem responses. It is
// safe for concurrent use; Close stops its background loops.
type Middleware struct {
	lc       *idem.LeaseConsumer
	o        Options
	consumer string
	// fin makes the final writes of an attempt and, in at-most-once mode
	// (AnswerUnknownAfterCrash), its recovery points: "idemhttp:run:"+token
	// saved before the handler runs (for a Proxy: before the first byte goes
	// to the upstream), "idemhttp:settled:"+token before a release whose
	// outcome is known.
	fin keyed.Finisher
	// runPrefix is fin.RunPrefix(), made once; onWait counts a waiting
	// duplicate (AcquireOptions.OnWait): both shared by every request.
	runPrefix string
	onWait    func()
	// delivery: Options.Hooks has core hooks, which read the request's
	// idem.Delivery (its trace context) from the context.
	delivery bool
	resp     []HookResponse
	// unknown is the answer stored for a key whose earlier attempt may
	// have acted and never recorded its response (AnswerUnknownAfterCrash).
	unknown func() *Problem

	stats struct {
		passThrough, executed, replayed, inProgress, waited, keyReused,
		released, completed, notReplayable, rejected, storeErrors,
		failOpen, leaseLost, panics, unknown atomic.Int64
	}
}

// Stats counts what a Middleware did since New. Every field is a count of
// requests.
type Stats struct {
	// PassThrough: methods not covered, no key on an optional route, or
	// unscoped requests under PassUnscoped.
	PassThrough int64
	// Executed: the handler ran holding the key's lease (or, in
	// at-most-once mode, an attempt that found an earlier one's outcome
	// unknown answered that; see Unknown).
	Executed int64
	// Replayed: a stored response was replayed.
	Replayed int64
	// InProgress: answered 409 request-in-progress (after Wait, if set).
	InProgress int64
	// Waited: duplicates that waited (Options.Wait) for the first request.
	Waited int64
	// KeyReused: answered 422 idempotency-key-reused.
	KeyReused int64
	// Released: the handler ran and its key was released (5xx, 408, 429,
	// a 101 without a hijack, panics, hijacks, DispositionRelease).
	Released int64
	// Completed: the handler ran and its response was recorded.
	Completed int64
	// NotReplayable: of Completed, responses over MaxResponseBytes; and
	// retries answered 410 replay-unavailable.
	NotReplayable int64
	// Rejected: answered 400, 401, 413 or 422 idempotency-key-expired
	// before any handler ran.
	Rejected int64
	// StoreErrors: store calls that failed (each answered 503, retried, or
	// logged).
	StoreErrors int64
	// FailOpen: handler runs without idempotency because the store was
	// unavailable (Options.FailOpen).
	FailOpen int64
	// LeaseLost: attempts whose lease was lost while the handler ran or
	// before its response was recorded.
	LeaseLost int64
	// Panics: handler panics.
	Panics int64
	// Unknown: attempts that took over a key whose earlier attempt ran
	// and ended without recording or releasing it, and stored the
	// outcome-unknown answer instead of running the handler
	// (AnswerUnknownAfterCrash).
	Unknown int64
}

// New returns a Middleware over store. Errors match ErrNoScope when
// opts.Scope is nil, and ErrInvalidOptions (and idem.ErrInvalidConfig)
// for any other invalid field. It starts the lease engine's background
// loops (marking the namespace running for retention, and, unless
// opts.PurgeInterval is negative, purging), which Close stops.
func New(store idemdriver.LeaseStore, opts Options) (*Middleware, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: nil store", ErrInvalidOptions)
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	m := &Middleware{o: o, consumer: consumerPrefix + o.Namespace}
	// No StoreTimeout of the Finisher's own: the lease engine bounds
	// each of its store calls by the same o.StoreTimeout.
	m.fin = keyed.Finisher{
		Name: "idemhttp", Consumer: m.consumer, Lease: o.Lease,
		AtMostOnce: m.atMostOnce(), Logger: o.Logger, StoreErrors: &m.stats.storeErrors, Released: &m.stats.released,
	}
	m.runPrefix = m.fin.RunPrefix()
	m.onWait = func() { m.stats.waited.Add(1) }
	m.unknown = func() *Problem {
		return newProblem(ProblemOutcomeUnknown, "an earlier attempt with this Idempotency-Key ran and ended without recording its response (its process stopped or lost the store); whether it took effect is unknown, so it is not run again. This answer is stored for the key")
	}
	var core []idem.Hook
	for i, h := range o.Hooks {
		r, isResp := h.(HookResponse)
		if isResp {
			m.resp = append(m.resp, r)
		}
		switch {
		case isCoreHook(h):
			core = append(core, h)
		case !isResp:
			return nil, fmt.Errorf("%w: Hooks[%d] (%T) implements none of the idem.Hook* interfaces nor HookResponse", ErrInvalidOptions, i, h)
		}
	}
	m.delivery = len(core) > 0
	m.lc, err = keyed.NewLeaseConsumer(store, m.consumer, idem.Config{
		RetentionWindow: o.Retention,
		PurgeInterval:   o.PurgeInterval,
		PurgeBatchSize:  o.PurgeBatchSize,
		Logger:          o.Logger,
		Hooks:           core,
		Lease:           o.Lease,
		StoreTimeout:    o.StoreTimeout,
		Coalesce:        o.Coalesce,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	return m, nil
}

// isCoreHook reports whether h implements one of the core's hook interfaces.
func isCoreHook(h idem.Hook) bool {
	switch h.(type) {
	case idem.HookProcessStart, idem.HookProcessEnd, idem.HookClaim, idem.HookOutcome,
		idem.HookLeaseRenewed, idem.HookLeaseTakenOver, idem.HookLeaseLost, idem.HookPurge, idem.HookStoreError:
		return true
	}
	return false
}

// Close stops the background loops and waits for them. Keyed requests
// that arrive later get 503 idempotency-unavailable (idem.ErrClosed);
// requests that pass through are still served. Idempotent; always
// returns nil.
func (m *Middleware) Close() error { return m.lc.Close() }

// Consumer returns the consumer name of this Middleware's records:
// "idemhttp:" + Options.Namespace.
func (m *Middleware) Consumer() string { return m.consumer }

// RecordID returns the store message ID of a scope and key: the
// base64url (unpadded, 22 characters) of the first 16 bytes of the
// SHA-256 of scope, then ':' and the key when it fits in 232 bytes, or
// '!' and the hex SHA-256 of the key when it does not. The scope is never
// stored in clear; the key stays readable for inspection.
func (m *Middleware) RecordID(scope, key string) string { return keyed.RecordID(scope, key) }

// Stats returns the counters.
func (m *Middleware) Stats() Stats {
	s := &m.stats
	return Stats{
		PassThrough: s.passThrough.Load(), Executed: s.executed.Load(), Replayed: s.replayed.Load(),
		InProgress: s.inProgress.Load(), Waited: s.waited.Load(), KeyReused: s.keyReused.Load(),
		Released: s.released.Load(), Completed: s.completed.Load(), NotReplayable: s.notReplayable.Load(),
		Rejected: s.rejected.Load(), StoreErrors: s.storeErrors.Load(), FailOpen: s.failOpen.Load(),
		LeaseLost: s.leaseLost.Load(), Panics: s.panics.Load(), Unknown: s.unknown.Load(),
	}
}

// Purge deletes this namespace's completed records that the namespace has
// outrun by Options.Retention of running time (idem.Purge: time in which
// no Middleware of the namespace was running does not count), in batches.
// In-progress records are never purged. It returns an error matching
// idem.ErrPurgeInProgress when another cleaner holds the purge lock. Each
// call is reported to the idem.HookPurge hooks of Options.Hooks.
func (m *Middleware) Purge(ctx context.Context) (idem.PurgeResult, error) { return m.lc.Purge(ctx) }

// Wrap returns h behind the middleware. A request with a covered method
// and an Idempotency-Key runs h at most once per (scope, key) while its
// record lives; without a key it passes through, unless
// Options.RequireKey is set (then 400 idempotency-key-missing).
func (m *Middleware) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, h, m.o.RequireKey)
	})
}

// Require is Wrap for a route that requires the key: a request with a
// covered method and no Idempotency-Key gets 400 idempotency-key-missing.
func (m *Middleware) Require(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, h, true)
	})
}

// covered reports whether the middleware applies to method.
func (m *Middleware) covered(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return false
	}
	return slices.Contains(m.o.Methods, method)
}

// reject answers a request that cannot be processed as sent (400, 401,
// 413, 422 idempotency-key-expired).
func (m *Middleware) reject(w http.ResponseWriter, ev *respTrack, p *Problem) {
	m.stats.rejected.Add(1)
	ev.problem(p)
	p.Write(w)
}

// serve is the idempotency path of one request.
func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler, required bool) {
	if !m.covered(r.Method) {
		m.stats.passThrough.Add(1)
		next.ServeHTTP(w, r)
		return
	}
	values := r.Header.Values(HeaderIdempotencyKey)
	if len(values) == 0 && !required {
		m.stats.passThrough.Add(1)
		next.ServeHTTP(w, r)
		return
	}
	key, keyErr := ParseKey(values, m.o.StrictKey, m.o.MaxKeyLength)
	var scope string
	var scopeErr error
	if keyErr == nil {
		scope, scopeErr = m.o.Scope(r)
		if (scopeErr != nil || scope == "") && m.o.Unscoped == PassUnscoped {
			m.stats.passThrough.Add(1)
			next.ServeHTTP(w, r)
			return
		}
	}
	var id string
	if keyErr == nil && scopeErr == nil && scope != "" {
		id = m.RecordID(scope, key)
	}
	ev := m.track(r, id)
	if ev != nil {
		defer ev.emit()
	}
	if keyErr != nil {
		typ := ProblemKeyInvalid
		if errors.Is(keyErr, ErrKeyMissing) {
			typ = ProblemKeyMissing
		}
		m.reject(w, ev, newProblem(typ, keyErr.(*KeyError).Reason))
		return
	}
	// Every answer on the idempotency path echoes the key, as Stripe does,
	// so a client (or a log) ties the response to the request it retried.
	w.Header()[HeaderIdempotencyKey] = []string{values[0]}
	if scopeErr != nil || scope == "" {
		var p *Problem
		if !errors.As(scopeErr, &p) {
			detail := "the request has no principal to scope its Idempotency-Key"
			if scopeErr != nil {
				detail += ": " + scopeErr.Error()
			}
			p = newProblem(ProblemScopeMissing, detail)
		}
		m.reject(w, ev, p)
		return
	}

	if r.ContentLength > m.o.MaxRequestBytes {
		m.reject(w, ev, newProblem(ProblemBodyTooLarge, fmt.Sprintf("the body has %d bytes; at most %d are accepted", r.ContentLength, m.o.MaxRequestBytes)))
		return
	}
	sp, err := spoolBody(r.Body, r.ContentLength, m.o.MaxRequestBytes, m.o.MemoryBodyBytes, m.o.TempDir)
	if err != nil {
		if errors.Is(err, errBodyTooLarge) {
			m.reject(w, ev, newProblem(ProblemBodyTooLarge, fmt.Sprintf("the body exceeds %d bytes", m.o.MaxRequestBytes)))
			return
		}
		m.reject(w, ev, newProblem(ProblemBodyUnreadable, err.Error()))
		return
	}
	defer sp.close()
	var fp []byte
	if m.o.CanonicalJSON && sp.inMemory() && isJSON(r.Header.Get("Content-Type")) {
		sum, mode := bodySum(sp.mem, true)
		fp = fingerprint(r, sum, mode)
	} else {
		fp = fingerprint(r, sp.sum[:], bodyRaw)
	}
	r.Body = sp.reader()
	r.ContentLength = sp.size
	r.TransferEncoding = nil

	opt := idem.AcquireOptions{Wait: m.o.Wait, OnWait: m.onWait}
	if m.atMostOnce() {
		// The recovery point is saved with the acquisition, before the
		// handler (or the upstream) runs: if this process dies while it
		// works, the attempt that takes the key over finds it and does
		// not run the request again.
		opt.StepPrefix = m.runPrefix
	}
	a, out, err := m.lc.Acquire(m.acquireContext(r), idem.Message{ID: id, Payload: fp}, opt)
	if a == nil {
		ev.outcome(out)
		m.answerExisting(w, r, next, ev, out, err)
		return
	}
	// The Info and its disposition and abort cells: one allocation.
	st := &infoState{Info: Info{Key: key, Scope: scope, Namespace: m.o.Namespace, Consumer: m.consumer, RecordID: id,
		Attempt: a.Number, Token: a.Token, attempt: a}}
	st.disp, st.abort = &st.dispCell, &st.abortCell
	info := &st.Info
	ev.acquired(a.Number)
	m.run(w, r, next, info, a, ev)
}

// acquireContext is the context of a request's Acquire: the request's,
// carrying its idem.Delivery when core hooks may read it. Without Wait it
// is detached from the client's cancellation: the request is not
// abandoned half-way when the client hangs up (the handler runs on the
// lease's context for the same reason), the store call is bounded by
// Options.StoreTimeout all the same, and the lease engine then bounds
// its calls with one context per attempt rather than a context and a
// timer per call. With Wait, a duplicate stops waiting when its client
// leaves.
func (m *Middleware) acquireContext(r *http.Request) context.Context {
	ctx := r.Context()
	if m.delivery {
		ctx = withRequestDelivery(r)
	}
	if m.o.Wait <= 0 {
		ctx = context.WithoutCancel(ctx)
	}
	return ctx
}

// infoState is an Info with the cells its disposition and abort point
// to, allocated as one.
type infoState struct {
	Info
	dispCell  atomic.Int32
	abortCell atomic.Pointer[Problem]
}

// answerExisting answers a request whose key the lease engine did not
// acquire: a replay, a problem, or a store outage.
func (m *Middleware) answerExisting(w http.ResponseWriter, r *http.Request, next http.Handler, ev *respTrack, out idem.Outcome, err error) {
	switch {
	case out.Status == idem.Duplicate:
		m.replay(w, ev, out)
	case out.Status == idem.InProgress:
		if r.Context().Err() != nil {
			return // the client left while it waited for the first request
		}
		m.stats.inProgress.Add(1)
		p := newProblem(ProblemInProgress, "a request with this Idempotency-Key is being processed; retry later with the same key")
		p.RetryAfter = m.o.InProgressRetryAfter
		ev.problem(p)
		p.Write(w)
	case out.Status == idem.FingerprintMismatch:
		m.stats.keyReused.Add(1)
		m.stats.rejected.Add(1)
		p := newProblem(ProblemKeyReused, "this Idempotency-Key was used with another request (method, path, query, media type or body); use a new key")
		ev.problem(p)
		p.Write(w)
	case out.Poison:
		m.o.Logger.Error("idemhttp: record in an unexpected state", "consumer", m.consumer, "error", err)
		p := newProblem(ProblemRecordCorrupt, "the record of this key is failed")
		ev.problem(p)
		p.Write(w)
	default:
		m.storeDown(w, r, next, ev, err)
	}
}

// replay answers a key whose record is completed.
func (m *Middleware) replay(w http.ResponseWriter, ev *respTrack, out idem.Outcome) {
	sr, err := decodeRecord(out.ContentType, out.Result)
	if err != nil {
		m.o.Logger.Error("idemhttp: stored record undecodable", "consumer", m.consumer, "error", err)
		p := newProblem(ProblemRecordCorrupt, "the stored response of this key cannot be decoded; the request was not run again")
		p.Err = errors.Join(ErrRecordCorrupt, err)
		ev.problem(p)
		p.Write(w)
		return
	}
	if m.o.ReplayWindow > 0 && m.o.Now().Sub(sr.created) > m.o.ReplayWindow {
		m.reject(w, ev, newProblem(ProblemKeyExpired, fmt.Sprintf("this Idempotency-Key was first used at %s; keys replay for %v", sr.created.UTC().Format(time.RFC3339), m.o.ReplayWindow)))
		return
	}
	if !sr.replayable {
		m.stats.notReplayable.Add(1)
		if loc := sr.header.Get("Location"); loc != "" {
			w.Header().Set("Location", loc)
		}
		p := newProblem(ProblemReplayUnavailable, fmt.Sprintf(
			"the request was processed (status %d, %d-byte response, SHA-256 %x) but its response was too large to store; it is not run again",
			sr.status, sr.size, sr.digest[:]))
		ev.problem(p)
		p.Write(w)
		return
	}
	m.stats.replayed.Add(1)
	ev.replayed(sr.status)
	h := w.Header()
	for k, vs := range sr.header {
		h[k] = vs
	}
	// The two fields' values in one allocation.
	vs := []string{strconv.Itoa(len(sr.body)), "true"}
	h["Content-Length"] = vs[0:1:1]
	h[HeaderReplayed] = vs[1:2:2]
	w.WriteHeader(sr.status)
	_, _ = w.Write(sr.body)
}

// storeDown answers a request whose Acquire failed.
func (m *Middleware) storeDown(w http.ResponseWriter, r *http.Request, next http.Handler, ev *respTrack, err error) {
	m.stats.storeErrors.Add(1)
	if keyed.IsConfigError(err) {
		m.o.Logger.Error("idemhttp: store refused the claim", "consumer", m.consumer, "error", err)
		p := newProblem(ProblemUnavailable, "the idempotency store refused the request")
		p.Status = http.StatusInternalServerError
		p.Err = err
		p.final = true // a configuration error: a retry gets the same
		ev.problem(p)
		p.Write(w)
		return
	}
	if m.o.FailOpen && !errors.Is(err, idem.ErrClosed) {
		m.stats.failOpen.Add(1)
		m.o.Logger.Warn("idemhttp: store unavailable, running without idempotency (FailOpen)", "consumer", m.consumer, "error", err)
		ev.failOpen()
		next.ServeHTTP(w, r)
		return
	}
	m.o.Logger.Warn("idemhttp: store unavailable", "consumer", m.consumer, "error", err)
	p := newProblem(ProblemUnavailable, "the idempotency store is unavailable and nothing was run; retry with the same key")
	p.RetryAfter = m.o.UnavailableRetryAfter
	ev.problem(p)
	p.Write(w)
}

// errReleased is the cause of the Failed outcome of a request whose
// response released its key.
type errReleased struct {
	status int
	why    string
}

func (e *errReleased) Error() string {
	return fmt.Sprintf("idemhttp: response %d released the key (%s); the retry runs the handler again", e.status, e.why)
}

// atMostOnce reports whether the middleware records a recovery point
// before the handler runs and answers outcome-unknown after a crash.
func (m *Middleware) atMostOnce() bool { return m.o.AfterCrash == AnswerUnknownAfterCrash }

// run runs the handler holding the attempt's lease (renewed by the lease
// engine), then completes or releases the key and delivers the response.
func (m *Middleware) run(w http.ResponseWriter, r *http.Request, next http.Handler, info *Info, a *idem.Attempt, ev *respTrack) {
	m.stats.executed.Add(1)
	created := m.o.Now()
	// Every way out ends the attempt: Processed when the response (or
	// the outcome-unknown answer) was recorded, Failed otherwise.
	ev.outcome(idem.Outcome{Status: idem.Failed})
	if m.atMostOnce() {
		if prev, ok := m.fin.Unsettled(a); ok {
			m.answerUnknown(w, a, ev, prev, created)
			return
		}
	}
	// The handler's context is the lease's, not the client's: a client
	// that hangs up does not cancel the request half-way (a handler that
	// returned early on the cancellation without writing would be stored
	// as an empty 200 and replayed). The request runs to its end and its
	// response is stored for the retry, as the Proxy does upstream; the
	// context ends when the lease is lost (idem.ErrLeaseLost).
	r = r.WithContext(context.WithValue(a.LeaseContext(), infoKey{}, info))

	rc := newRecorder(w, m.o.MaxResponseBytes)
	panicked, pv := runHandler(next, rc, r)
	rc.seal()
	if errors.Is(context.Cause(a.LeaseContext()), idem.ErrLeaseLost) {
		m.stats.leaseLost.Add(1)
	}

	if panicked {
		m.stats.panics.Add(1)
		m.o.Logger.Error("idemhttp: handler panicked; key released", "consumer", m.consumer, "panic", pv, "stack", string(debug.Stack()))
		_ = m.release(a, fmt.Errorf("%w: %v", idem.ErrHandlerPanic, pv))
		if pv == http.ErrAbortHandler || rc.started() {
			ev.aborted()
			panic(http.ErrAbortHandler)
		}
		p := newProblem(ProblemHandlerPanic, "the handler failed; the key was released, retry with it")
		ev.problem(p)
		p.Write(w)
		return
	}

	sr := rc.result(m.o.StoreSetCookie)
	abort := info.abort.Load()
	if abort != nil {
		// The streamed response is broken: what is stored is abort.
		sr = problemResponse(abort, m.o.StoreSetCookie)
	}
	sr.created = created
	var rel bool
	why := "status"
	switch Disposition(info.disp.Load()) {
	case DispositionStore:
	case DispositionRelease:
		rel, why = true, "SetDisposition"
	default:
		rel = m.o.ReleaseStatus(sr.status)
	}
	if rc.hijackTried {
		rel, why = true, "Hijack"
	}
	if sr.status < 200 {
		// 101 Switching Protocols without a hijack: no response to
		// replay (a record with it would read as corrupt).
		rel, why = true, "status"
	}
	if rel {
		_ = m.release(a, &errReleased{sr.status, why})
		ev.handler(sr.status, abort != nil)
		deliver(rc, abort)
		return
	}
	err := m.complete(a, sr)
	if err == nil {
		ev.outcome(idem.Outcome{Status: idem.Processed})
		m.stats.completed.Add(1)
		if !sr.replayable {
			m.stats.notReplayable.Add(1)
		}
		ev.handler(sr.status, abort != nil)
		deliver(rc, abort)
		return
	}
	m.o.Logger.Error("idemhttp: could not record the response before the lease ended",
		"consumer", m.consumer, "record", info.RecordID, "attempt", info.Attempt, "error", err)
	if rc.started() || m.o.CompleteFailure == DeliverResponse {
		ev.handler(sr.status, abort != nil)
		deliver(rc, abort)
		return
	}
	if errors.Is(err, idem.ErrLeaseLost) && !errors.Is(err, idem.ErrStore) {
		m.leaseLostAnswer(w, ev)
		return
	}
	detail := "the request ran but its response could not be recorded before this attempt's lease ended; a retry with the same key may run it again"
	if m.atMostOnce() {
		detail = "the request ran but its response could not be recorded before this attempt's lease ended; a retry with the same key gets this response if its recording landed after all, and otherwise is answered that its outcome is unknown"
	}
	p := newProblem(ProblemUnavailable, detail)
	p.RetryAfter = m.o.Lease // when a retry can take the key over
	ev.problem(p)
	p.Write(w)
}

// leaseLostAnswer answers 409 idempotency-lease-lost: another attempt
// owns the key now.
func (m *Middleware) leaseLostAnswer(w http.ResponseWriter, ev *respTrack) {
	m.stats.leaseLost.Add(1)
	p := newProblem(ProblemLeaseLost, "another attempt took this Idempotency-Key over; retry with the same key to get its result")
	p.RetryAfter = m.o.InProgressRetryAfter
	ev.problem(p)
	p.Write(w)
}

// answerUnknown stores and answers the outcome-unknown problem for a key
// whose attempt with token prev may have acted and never recorded its
// response: the request is not run again, and every retry gets the same.
func (m *Middleware) answerUnknown(w http.ResponseWriter, a *idem.Attempt, ev *respTrack, prev string, created time.Time) {
	m.stats.unknown.Add(1)
	m.o.Logger.Warn("idemhttp: an earlier attempt ran and never recorded its response; storing outcome-unknown",
		"consumer", m.consumer, "record", a.Message.ID, "earlier_token", prev, "attempt", a.Number)
	p := m.unknown()
	sr := problemResponse(p, false)
	sr.created = created
	if err := m.complete(a, sr); err != nil {
		m.o.Logger.Error("idemhttp: could not record outcome-unknown", "consumer", m.consumer, "record", a.Message.ID, "error", err)
	} else {
		ev.outcome(idem.Outcome{Status: idem.Processed})
	}
	ev.problem(p)
	p.Write(w)
}

// complete records sr as the key's response (retried while the lease is
// held) and ends the attempt; nil when it was recorded.
func (m *Middleware) complete(a *idem.Attempt, sr *storedResponse) error {
	return m.fin.Complete(a, idem.Result{Body: encodeRecord(sr), ContentType: recordContentType})
}

// release releases the key after cause (keyed.Finisher.Release).
func (m *Middleware) release(a *idem.Attempt, cause error) error { return m.fin.Release(a, cause) }

// deliver sends the client what it has not had of the response, or, when
// the handler marked the streamed response broken (abortWith), aborts the
// client's connection so a short body is never taken as complete.
func deliver(rc *recorder, abort *Problem) {
	if abort != nil {
		panic(http.ErrAbortHandler)
	}
	rc.finish()
}

// problemResponse is p as a stored response.
func problemResponse(p *Problem, storeSetCookie bool) *storedResponse {
	rc := newRecorder(nopWriter{http.Header{}}, 1<<20)
	p.Write(rc)
	return rc.result(storeSetCookie)
}

// nopWriter is a ResponseWriter that discards what it is given.
type nopWriter struct{ h http.Header }

func (w nopWriter) Header() http.Header       { return w.h }
func (nopWriter) Write(p []byte) (int, error) { return len(p), nil }
func (nopWriter) WriteHeader(int)             {}

// runHandler calls next, recovering a panic.
func runHandler(next http.Handler, w http.ResponseWriter, r *http.Request) (panicked bool, v any) {
	panicked = true
	defer func() {
		if panicked {
			v = recover()
		}
	}()
	next.ServeHTTP(w, r)
	return false, nil
}

package idemhttp

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// consumerPrefix starts the consumer name of every record of this package.
const consumerPrefix = "idemhttp:"

// maxInlineKey is the longest key kept readable in a record ID: the scope
// hash (22 bytes) and a separator leave 232 of the store's 255 bytes.
const maxInlineKey = 255 - 23

// Middleware is idempotency-key middleware for net/http over an
// idemdriver.LeaseStore (memory, PostgreSQL, MariaDB/MySQL, SQLite or Redis).
// See the package documentation for its semantics. It is safe for
// concurrent use; Close stops its purge loop.
type Middleware struct {
	store    idemdriver.LeaseStore
	o        Options
	consumer string
	hooks    *hooks // nil without Options.Hooks
	// runs is the core's lease consumer of this namespace, used for its
	// run marking: it records in the store that the namespace is served,
	// from which retention counts (see idem.Purge).
	runs *idem.LeaseConsumer

	stats struct {
		passThrough, executed, replayed, inProgress, waited, keyReused,
		released, completed, notReplayable, rejected, storeErrors,
		failOpen, leaseLost, panics atomic.Int64
	}

	closeOnce sync.Once
	stop      chan struct{}
	done      chan struct{}
}

// Stats counts what a Middleware did since New. Every field is a count of
// requests.
type Stats struct {
	// PassThrough: methods not covered, no key on an optional route, or
	// unscoped requests under PassUnscoped.
	PassThrough int64
	// Executed: the handler ran holding the key's lease.
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
	// StoreErrors: store calls that failed (each answered 503, or logged).
	StoreErrors int64
	// FailOpen: handler runs without idempotency because the store was
	// unavailable (Options.FailOpen).
	FailOpen int64
	// LeaseLost: attempts whose lease was lost while the handler ran.
	LeaseLost int64
	// Panics: handler panics.
	Panics int64
}

// New returns a Middleware over store. Errors match ErrNoScope when
// opts.Scope is nil, and ErrInvalidOptions (and idem.ErrInvalidConfig)
// for any other invalid field. Unless opts.PurgeInterval is negative it
// starts the background purge loop, which Close stops.
func New(store idemdriver.LeaseStore, opts Options) (*Middleware, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: nil store", ErrInvalidOptions)
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	m := &Middleware{store: store, o: o, consumer: consumerPrefix + o.Namespace, stop: make(chan struct{}), done: make(chan struct{})}
	if m.hooks, err = newHooks(o.Hooks, m.consumer, o.Logger); err != nil {
		return nil, err
	}
	if m.runs, err = idem.NewLeaseConsumer(store, idem.Config{
		Name: m.consumer, RetentionWindow: o.Retention, PurgeInterval: -1, Logger: o.Logger,
	}); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	if o.PurgeInterval > 0 {
		go m.purgeLoop()
	} else {
		close(m.done)
	}
	return m, nil
}

// Close stops the background purge loop and waits for it. The Middleware
// keeps serving requests. Idempotent; always returns nil.
func (m *Middleware) Close() error {
	m.closeOnce.Do(func() { close(m.stop) })
	<-m.done
	return m.runs.Close()
}

// Consumer returns the consumer name of this Middleware's records:
// "idemhttp:" + Options.Namespace.
func (m *Middleware) Consumer() string { return m.consumer }

// RecordID returns the store message ID of a scope and key: the
// base64url (unpadded, 22 characters) of the first 16 bytes of the
// SHA-256 of scope, then ':' and the key when it fits in 232 bytes, or
// '!' and the hex SHA-256 of the key when it does not. The scope is never
// stored in clear; the key stays readable for inspection.
func (m *Middleware) RecordID(scope, key string) string {
	sh := sha256.Sum256([]byte(scope))
	id := base64.RawURLEncoding.EncodeToString(sh[:16])
	if len(key) <= maxInlineKey {
		return id + ":" + key
	}
	kh := sha256.Sum256([]byte(key))
	return id + "!" + hex.EncodeToString(kh[:])
}

// Stats returns the counters.
func (m *Middleware) Stats() Stats {
	s := &m.stats
	return Stats{
		PassThrough: s.passThrough.Load(), Executed: s.executed.Load(), Replayed: s.replayed.Load(),
		InProgress: s.inProgress.Load(), Waited: s.waited.Load(), KeyReused: s.keyReused.Load(),
		Released: s.released.Load(), Completed: s.completed.Load(), NotReplayable: s.notReplayable.Load(),
		Rejected: s.rejected.Load(), StoreErrors: s.storeErrors.Load(), FailOpen: s.failOpen.Load(),
		LeaseLost: s.leaseLost.Load(), Panics: s.panics.Load(),
	}
}

// Purge deletes this namespace's completed records that the middleware
// has outrun by Options.Retention of running time (counted from each
// record's completion; time in which no middleware of the namespace ran
// does not count; see idem.Purge), in batches. In-progress records are never purged. It returns
// idem.ErrPurgeInProgress when another cleaner holds the purge lock.
//
// Each call is reported to the idem.HookPurge hooks of Options.Hooks, and
// a failure other than idem.ErrPurgeInProgress to the idem.HookStoreError
// hooks (op "purge"), as a consumer's purge is.
func (m *Middleware) Purge(ctx context.Context) (idem.PurgeResult, error) {
	start := time.Now()
	res, err := idem.Purge(ctx, m.store, idem.PurgeParams{
		Consumer:        m.consumer,
		RetentionWindow: m.o.Retention,
		BatchSize:       m.o.PurgeBatchSize,
	})
	if m.hooks != nil {
		herr := err
		if err != nil && !errors.Is(err, idem.ErrPurgeInProgress) {
			herr = m.storeErr(ctx, "purge", "", err)
		}
		m.purged(ctx, res, herr, time.Since(start))
	}
	return res, err
}

func (m *Middleware) purgeLoop() {
	defer close(m.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-m.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		jitter := time.Duration(rand.Int64N(int64(m.o.PurgeInterval)/10 + 1))
		t := time.NewTimer(m.o.PurgeInterval - m.o.PurgeInterval/20 + jitter)
		select {
		case <-m.stop:
			t.Stop()
			return
		case <-t.C:
		}
		if _, err := m.Purge(ctx); err != nil && !errors.Is(err, idem.ErrPurgeInProgress) && ctx.Err() == nil {
			m.o.Logger.Warn("idemhttp: purge failed", "consumer", m.consumer, "error", err)
		}
	}
}

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
// 413, 422 idempotency-key-expired): outcome idem.Rejected, its error
// wrapping cause (an idem sentinel, when one fits) and p.
func (m *Middleware) reject(w http.ResponseWriter, t *reqTrack, p *Problem, cause error, reason idem.DuplicateReason) {
	m.stats.rejected.Add(1)
	t.settle(idem.Outcome{Status: idem.Rejected, Err: wrapProblem(cause, p)}, reason, p.Status)
	p.Write(w)
}

// wrapProblem returns p as an error that also matches cause (nil: p).
func wrapProblem(cause error, p *Problem) error {
	if cause == nil {
		return p
	}
	return fmt.Errorf("%w: %w", cause, p)
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
	// From here on the request is one delivery for the hooks.
	ctx, t := m.begin(r.Context(), id)
	if t != nil {
		defer t.end()
		r = r.WithContext(ctx)
	}
	if keyErr != nil {
		typ, cause := ProblemKeyInvalid, idem.ErrInvalidMessageID
		if errors.Is(keyErr, ErrKeyMissing) {
			typ, cause = ProblemKeyMissing, idem.ErrMissingMessageID
		}
		m.reject(w, t, newProblem(typ, keyErr.(*KeyError).Reason), cause, idem.NotDuplicate)
		return
	}
	if scopeErr != nil || scope == "" {
		var p *Problem
		if !errors.As(scopeErr, &p) {
			detail := "the request has no principal to scope its Idempotency-Key"
			if scopeErr != nil {
				detail += ": " + scopeErr.Error()
			}
			p = newProblem(ProblemScopeMissing, detail)
		}
		m.reject(w, t, p, nil, idem.NotDuplicate)
		return
	}

	if r.ContentLength > m.o.MaxRequestBytes {
		m.reject(w, t, newProblem(ProblemBodyTooLarge, fmt.Sprintf("the body has %d bytes; at most %d are accepted", r.ContentLength, m.o.MaxRequestBytes)), idem.ErrInvalidPayload, idem.NotDuplicate)
		return
	}
	sp, err := spoolBody(r.Body, m.o.MaxRequestBytes, m.o.MemoryBodyBytes, m.o.TempDir)
	if err != nil {
		if errors.Is(err, errBodyTooLarge) {
			m.reject(w, t, newProblem(ProblemBodyTooLarge, fmt.Sprintf("the body exceeds %d bytes", m.o.MaxRequestBytes)), idem.ErrInvalidPayload, idem.NotDuplicate)
			return
		}
		m.reject(w, t, newProblem(ProblemBodyUnreadable, err.Error()), idem.ErrInvalidPayload, idem.NotDuplicate)
		return
	}
	defer sp.close()
	var fp []byte
	if m.o.CanonicalJSON && sp.inMemory() && isJSON(r.Header.Get("Content-Type")) {
		sum, mode := bodySum(sp.mem, true)
		fp = fingerprint(r, sum, mode)
	} else {
		fp = fingerprint(r, sp.sum, bodyRaw)
	}
	r.Body = sp.reader()
	r.ContentLength = sp.size
	r.TransferEncoding = nil

	info := &Info{Key: key, Scope: scope, Namespace: m.o.Namespace, Consumer: m.consumer, RecordID: id}
	since := t.now()
	ar, err := m.acquire(r.Context(), id, fp)
	if err != nil {
		m.storeDown(w, r, next, t, err)
		return
	}
	var waitUntil time.Time
	if !ar.Acquired && ar.State == idemdriver.StateInProgress && m.o.Wait > 0 && slices.Equal(ar.Fingerprint, fp) {
		m.stats.waited.Add(1)
		waitUntil = time.Now().Add(m.o.Wait)
		ar, since, err = m.wait(r.Context(), id, fp, waitUntil)
		if err != nil {
			if cerr := r.Context().Err(); cerr != nil {
				// The client left while it waited for the first request.
				t.settle(idem.Outcome{Status: idem.InProgress, Attempt: ar.Attempt,
					Err: fmt.Errorf("%w: the client left while waiting: %w", idem.ErrInProgress, context.Cause(r.Context()))},
					idem.DuplicateInProgress, 0)
				return
			}
			m.storeDown(w, r, next, t, err)
			return
		}
	}
	if !ar.Acquired {
		m.answerExisting(w, t, ar, fp)
		return
	}
	info.Attempt, info.Token = ar.Attempt, ar.Token
	t.claimedKey(ar.Attempt, ar.Token, since)
	m.run(w, r, next, info, t)
}

// now returns the time for a latency measurement, or the zero time when
// nothing is tracked.
func (t *reqTrack) now() time.Time {
	if t == nil {
		return time.Time{}
	}
	return time.Now()
}

// acquire calls Acquire with a bounded context.
func (m *Middleware) acquire(ctx context.Context, id string, fp []byte) (idemdriver.AcquireResult, error) {
	ctx, cancel := context.WithTimeout(ctx, m.o.StoreTimeout)
	defer cancel()
	return m.store.Acquire(ctx, &idemdriver.AcquireParams{Consumer: m.consumer, MessageID: id, Fingerprint: fp, Lease: m.o.Lease})
}

// wait polls the record until it is completed, acquired (the first
// attempt released it, or its lease ran out) or the deadline passes. It
// returns the last Acquire's result and start time.
func (m *Middleware) wait(ctx context.Context, id string, fp []byte, until time.Time) (idemdriver.AcquireResult, time.Time, error) {
	delay := 20 * time.Millisecond
	for {
		left := time.Until(until)
		if left <= 0 {
			return idemdriver.AcquireResult{State: idemdriver.StateInProgress, Fingerprint: fp}, time.Time{}, nil
		}
		t := time.NewTimer(min(delay, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return idemdriver.AcquireResult{}, time.Time{}, ctx.Err()
		case <-t.C:
		}
		delay = min(delay*3/2, 250*time.Millisecond)
		since := time.Now()
		ar, err := m.acquire(ctx, id, fp)
		if err != nil {
			return ar, since, err
		}
		if ar.Acquired || ar.State != idemdriver.StateInProgress {
			return ar, since, nil
		}
	}
}

// storeDown answers a request whose Acquire failed.
func (m *Middleware) storeDown(w http.ResponseWriter, r *http.Request, next http.Handler, t *reqTrack, err error) {
	m.stats.storeErrors.Add(1)
	serr := m.storeErr(r.Context(), "acquire", t.trackID(), err)
	if errIsConfig(err) {
		m.o.Logger.Error("idemhttp: store refused the claim", "consumer", m.consumer, "error", err)
		p := newProblem(ProblemUnavailable, "the idempotency store refused the request")
		p.Status = http.StatusInternalServerError
		p.Err = err
		t.settle(idem.Outcome{Status: idem.Failed, Err: serr}, idem.NotDuplicate, p.Status)
		p.Write(w)
		return
	}
	if m.o.FailOpen {
		m.stats.failOpen.Add(1)
		m.o.Logger.Warn("idemhttp: store unavailable, running without idempotency (FailOpen)", "consumer", m.consumer, "error", err)
		// Nothing protects or records this run: Failed for the pattern,
		// whatever the handler answers.
		t.settle(idem.Outcome{Status: idem.Failed, Err: serr}, idem.NotDuplicate, 0)
		next.ServeHTTP(w, r)
		return
	}
	m.o.Logger.Warn("idemhttp: store unavailable", "consumer", m.consumer, "error", err)
	p := newProblem(ProblemUnavailable, "the idempotency store is unavailable; retry with the same key")
	p.RetryAfter = m.o.UnavailableRetryAfter
	t.settle(idem.Outcome{Status: idem.Failed, Err: serr}, idem.NotDuplicate, p.Status)
	p.Write(w)
}

// answerExisting answers a request whose key has a record it did not
// acquire: a replay, or a problem.
func (m *Middleware) answerExisting(w http.ResponseWriter, t *reqTrack, ar idemdriver.AcquireResult, fp []byte) {
	if !slices.Equal(ar.Fingerprint, fp) {
		m.stats.keyReused.Add(1)
		m.stats.rejected.Add(1)
		p := newProblem(ProblemKeyReused, "this Idempotency-Key was used with another request (method, path, query, media type or body); use a new key")
		t.settle(idem.Outcome{Status: idem.FingerprintMismatch, Err: wrapProblem(idem.ErrFingerprintMismatch, p)}, idem.DuplicateFingerprintMismatch, p.Status)
		p.Write(w)
		return
	}
	switch ar.State {
	case idemdriver.StateInProgress:
		m.stats.inProgress.Add(1)
		p := newProblem(ProblemInProgress, "a request with this Idempotency-Key is being processed; retry later with the same key")
		p.RetryAfter = m.o.InProgressRetryAfter
		t.settle(idem.Outcome{Status: idem.InProgress, Err: wrapProblem(idem.ErrInProgress, p), RetryAfter: p.RetryAfter, Attempt: ar.Attempt},
			idem.DuplicateInProgress, p.Status)
		p.Write(w)
		return
	case idemdriver.StateCompleted:
	default:
		m.o.Logger.Error("idemhttp: record in an unexpected state", "consumer", m.consumer, "state", ar.State, "error", ar.Error)
		p := newProblem(ProblemRecordCorrupt, fmt.Sprintf("the record of this key is %s", ar.State))
		t.settle(idem.Outcome{Status: idem.Failed, Err: p, Attempt: ar.Attempt}, idem.NotDuplicate, p.Status)
		p.Write(w)
		return
	}
	sr, err := decodeRecord(ar.ContentType, ar.Result)
	if err != nil {
		m.o.Logger.Error("idemhttp: stored record undecodable", "consumer", m.consumer, "error", err)
		p := newProblem(ProblemRecordCorrupt, "the stored response of this key cannot be decoded; the request was not run again")
		p.Err = errors.Join(ErrRecordCorrupt, err)
		t.settle(idem.Outcome{Status: idem.Failed, Err: p, Attempt: ar.Attempt}, idem.NotDuplicate, p.Status)
		p.Write(w)
		return
	}
	if m.o.ReplayWindow > 0 && m.o.Now().Sub(sr.created) > m.o.ReplayWindow {
		m.reject(w, t, newProblem(ProblemKeyExpired, fmt.Sprintf("this Idempotency-Key was first used at %s; keys replay for %v", sr.created.UTC().Format(time.RFC3339), m.o.ReplayWindow)), nil, idem.DuplicateCompleted)
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
		// Processed before and not run again: a duplicate absorbed,
		// whose response cannot be replayed.
		t.settle(idem.Outcome{Status: idem.Duplicate, Attempt: ar.Attempt}, idem.DuplicateCompleted, p.Status)
		p.Write(w)
		return
	}
	m.stats.replayed.Add(1)
	t.settle(idem.Outcome{Status: idem.Duplicate, Attempt: ar.Attempt}, idem.DuplicateCompleted, sr.status)
	h := w.Header()
	for k, vs := range sr.header {
		h[k] = vs
	}
	h.Set("Content-Length", strconv.Itoa(len(sr.body)))
	h.Set(HeaderReplayed, "true")
	w.WriteHeader(sr.status)
	_, _ = w.Write(sr.body)
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

// run runs the handler holding the lease, renewing it, then completes or
// releases the key and delivers the response.
func (m *Middleware) run(w http.ResponseWriter, r *http.Request, next http.Handler, info *Info, t *reqTrack) {
	m.stats.executed.Add(1)
	created := m.o.Now()
	info.disp = new(atomic.Int32)
	info.abort = new(atomic.Pointer[Problem])
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	r = r.WithContext(context.WithValue(ctx, infoKey{}, info))

	var lost atomic.Bool
	stop := make(chan struct{})
	renewed := make(chan struct{})
	go m.renew(context.WithoutCancel(ctx), info, t, cancel, &lost, stop, renewed)

	rc := newRecorder(w, m.o.MaxResponseBytes)
	panicked, pv := runHandler(next, rc, r)
	rc.seal()
	close(stop)
	<-renewed
	if lost.Load() {
		m.stats.leaseLost.Add(1)
	}

	detached := context.WithoutCancel(r.Context())
	final, fcancel := context.WithTimeout(detached, m.o.StoreTimeout)
	defer fcancel()
	if panicked {
		m.stats.panics.Add(1)
		m.o.Logger.Error("idemhttp: handler panicked; key released", "consumer", m.consumer, "panic", pv, "stack", string(debug.Stack()))
		relErr := m.release(final, detached, info, t, fmt.Sprintf("panic: %v", pv))
		cause := errors.Join(fmt.Errorf("%w: %v", idem.ErrHandlerPanic, pv), relErr)
		if pv == http.ErrAbortHandler || rc.started() {
			t.settle(idem.Outcome{Status: idem.Failed, Err: cause}, idem.NotDuplicate, 0)
			panic(http.ErrAbortHandler)
		}
		p := newProblem(ProblemHandlerPanic, "the handler failed; the key was released, retry with it")
		t.settle(idem.Outcome{Status: idem.Failed, Err: cause}, idem.NotDuplicate, p.Status)
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
		relErr := m.release(final, detached, info, t, fmt.Sprintf("status %d", sr.status))
		t.settle(idem.Outcome{Status: idem.Failed, Err: errors.Join(&errReleased{sr.status, why}, relErr)}, idem.NotDuplicate, sr.status)
		deliver(rc, abort)
		return
	}
	since := time.Now()
	err := m.store.Complete(final, &idemdriver.CompleteParams{
		Consumer: m.consumer, MessageID: info.RecordID, Token: info.Token,
		Result: encodeRecord(sr), ContentType: recordContentType,
	})
	if err == nil {
		m.stats.completed.Add(1)
		if !sr.replayable {
			m.stats.notReplayable.Add(1)
		}
		t.settle(idem.Outcome{Status: idem.Processed}, idem.NotDuplicate, sr.status)
		deliver(rc, abort)
		return
	}
	m.stats.storeErrors.Add(1)
	m.o.Logger.Error("idemhttp: could not record the response; the key stays in progress until its lease runs out",
		"consumer", m.consumer, "record", info.RecordID, "attempt", info.Attempt, "error", err)
	isLost := errors.Is(err, idem.ErrLeaseLost)
	if isLost {
		err = fmt.Errorf("%w: attempt %d (token %d) finished after another attempt took the key over; its response was not stored", err, info.Attempt, info.Token)
		t.leaseLost(detached, "complete", time.Since(since), err)
	} else {
		err = m.storeErr(detached, "complete", info.RecordID, err)
	}
	if rc.started() || m.o.CompleteFailure == DeliverResponse {
		t.settle(idem.Outcome{Status: idem.Failed, Err: err}, idem.NotDuplicate, sr.status)
		deliver(rc, abort)
		return
	}
	if isLost {
		p := newProblem(ProblemLeaseLost, "another attempt took this Idempotency-Key over; retry with the same key to get its result")
		p.RetryAfter = m.o.InProgressRetryAfter
		t.settle(idem.Outcome{Status: idem.Failed, Err: err}, idem.NotDuplicate, p.Status)
		p.Write(w)
		return
	}
	p := newProblem(ProblemUnavailable, "the request ran but its response could not be recorded; retry with the same key")
	p.RetryAfter = m.o.UnavailableRetryAfter
	t.settle(idem.Outcome{Status: idem.Failed, Err: err}, idem.NotDuplicate, p.Status)
	p.Write(w)
}

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

// release releases the attempt's lease so the next retry runs. It returns
// nil, or the error (matching idem.ErrLeaseLost or idem.ErrStore) that
// kept the key from being released. hctx is the hooks' context.
func (m *Middleware) release(ctx, hctx context.Context, info *Info, t *reqTrack, why string) error {
	m.stats.released.Add(1)
	since := time.Now()
	err := m.store.Release(ctx, &idemdriver.ReleaseParams{Consumer: m.consumer, MessageID: info.RecordID, Token: info.Token, Error: why})
	if err == nil {
		if t != nil {
			t.released = true
		}
		return nil
	}
	m.stats.storeErrors.Add(1)
	m.o.Logger.Warn("idemhttp: could not release the key; it frees when its lease runs out",
		"consumer", m.consumer, "record", info.RecordID, "error", err)
	if errors.Is(err, idem.ErrLeaseLost) {
		t.leaseLost(hctx, "release", time.Since(since), err)
		return err
	}
	return m.storeErr(hctx, "release", info.RecordID, err)
}

// renew renews the lease every Lease/3 until stop is closed. When the
// lease is lost (another attempt took over, or no renewal reached the
// store for a whole lease) it cancels the handler's context with cause
// idem.ErrLeaseLost.
func (m *Middleware) renew(ctx context.Context, info *Info, tr *reqTrack, cancel context.CancelCauseFunc, lost *atomic.Bool, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(m.o.Lease / 3)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		start := time.Now()
		rctx, rcancel := context.WithTimeout(ctx, min(m.o.StoreTimeout, m.o.Lease))
		err := m.store.Renew(rctx, &idemdriver.RenewParams{Consumer: m.consumer, MessageID: info.RecordID, Token: info.Token, Lease: m.o.Lease})
		rcancel()
		if err == nil {
			last = start
			tr.renewed(ctx, time.Since(start))
			continue
		}
		if errors.Is(err, idem.ErrLeaseLost) {
			tr.leaseLost(ctx, "renew", time.Since(start), err)
		} else {
			_ = m.storeErr(ctx, "renew", info.RecordID, err)
		}
		if errors.Is(err, idem.ErrLeaseLost) || time.Since(last) >= m.o.Lease {
			lost.Store(true)
			m.o.Logger.Warn("idemhttp: lease lost while the handler runs", "consumer", m.consumer, "record", info.RecordID, "error", err)
			cancel(idem.ErrLeaseLost)
			return
		}
		m.stats.storeErrors.Add(1)
		m.o.Logger.Warn("idemhttp: lease renewal failed", "consumer", m.consumer, "record", info.RecordID, "error", err)
	}
}

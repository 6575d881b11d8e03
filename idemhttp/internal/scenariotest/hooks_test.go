package scenariotest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemhttp"
)

// recHook records every hook call. Each request's events are grouped by
// the *recReq its OnProcessStart put in the context, so a test sees which
// events belong to which request, in order; events whose context carries
// no request (purges) are kept apart.
type recHook struct {
	mu    sync.Mutex
	reqs  []*recReq
	loose []string
	// background are the store errors of the consumer's own calls (op
	// "mark-running" or "purge"), outside any request.
	background []idem.StoreErrorEvent
	purges     []idem.PurgeEvent
	resps      []idemhttp.ResponseEvent // HookResponse, in order
	renewed    chan struct{}            // a value per renewal, when not nil
}

// lastResponse returns the newest response event and removes it.
func (h *recHook) lastResponse() (idemhttp.ResponseEvent, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.resps) == 0 {
		return idemhttp.ResponseEvent{}, false
	}
	e := h.resps[len(h.resps)-1]
	h.resps = h.resps[:len(h.resps)-1]
	return e, true
}

// OnResponse records the HTTP side of a request (HookResponse).
func (h *recHook) OnResponse(_ context.Context, e idemhttp.ResponseEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.resps = append(h.resps, e)
}

// response returns the oldest unclaimed response event of record id
// with outcome status st, and removes it.
func (h *recHook) response(id string, st idem.Status) (idemhttp.ResponseEvent, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, e := range h.resps {
		if e.RecordID == id && e.Outcome == st {
			h.resps = slices.Delete(h.resps, i, i+1)
			return e, true
		}
	}
	return idemhttp.ResponseEvent{}, false
}

// recReq is what one request reported.
type recReq struct {
	h        *recHook
	kinds    []string
	start    idem.ProcessStartEvent
	claim    *idem.ClaimEvent
	outcome  idem.OutcomeEvent
	end      idem.ProcessEndEvent
	takeover []idem.LeaseEvent
	renewals []idem.LeaseEvent
	lost     []idem.LeaseEvent
	storeErr []idem.StoreErrorEvent
}

type recKey struct{}

// recFrom returns the request of ctx (nil when none).
func recFrom(ctx context.Context) *recReq {
	r, _ := ctx.Value(recKey{}).(*recReq)
	return r
}

// add runs f on the request of ctx with the lock held, recording kind; an
// event without one is recorded as loose.
func (h *recHook) add(ctx context.Context, kind string, f func(r *recReq)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := recFrom(ctx)
	if r == nil {
		h.loose = append(h.loose, kind)
		return
	}
	r.kinds = append(r.kinds, kind)
	f(r)
}

func (h *recHook) OnProcessStart(ctx context.Context, e idem.ProcessStartEvent) context.Context {
	r := &recReq{h: h, start: e, kinds: []string{"start"}}
	h.mu.Lock()
	h.reqs = append(h.reqs, r)
	h.mu.Unlock()
	return context.WithValue(ctx, recKey{}, r)
}

func (h *recHook) OnProcessEnd(ctx context.Context, e idem.ProcessEndEvent) {
	h.add(ctx, "end", func(r *recReq) { r.end = e })
}

func (h *recHook) OnClaim(ctx context.Context, e idem.ClaimEvent) {
	h.add(ctx, "claim", func(r *recReq) { r.claim = &e })
}

func (h *recHook) OnOutcome(ctx context.Context, e idem.OutcomeEvent) {
	h.add(ctx, "outcome", func(r *recReq) { r.outcome = e })
}

func (h *recHook) OnLeaseRenewed(ctx context.Context, e idem.LeaseEvent) {
	h.add(ctx, "renewed", func(r *recReq) { r.renewals = append(r.renewals, e) })
	if h.renewed != nil {
		select {
		case h.renewed <- struct{}{}:
		default:
		}
	}
}

func (h *recHook) OnLeaseTakenOver(ctx context.Context, e idem.LeaseEvent) {
	h.add(ctx, "takeover", func(r *recReq) { r.takeover = append(r.takeover, e) })
}

func (h *recHook) OnLeaseLost(ctx context.Context, e idem.LeaseEvent) {
	h.add(ctx, "lost", func(r *recReq) { r.lost = append(r.lost, e) })
}

func (h *recHook) OnPurge(_ context.Context, e idem.PurgeEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.purges = append(h.purges, e)
}

// OnStoreError records a store error on its request. The consumer's own
// background calls (the running mark, a purge) belong to no request: a
// slow store may fail them at any time (a mark times out on a loaded
// machine), so they are kept apart; any other event without a request is
// loose.
func (h *recHook) OnStoreError(ctx context.Context, e idem.StoreErrorEvent) {
	if recFrom(ctx) == nil && e.MessageID == "" && (e.Op == "mark-running" || e.Op == "purge") {
		h.mu.Lock()
		h.background = append(h.background, e)
		h.mu.Unlock()
		return
	}
	h.add(ctx, fmt.Sprintf("store_error(%s)", e.Op), func(r *recReq) { r.storeErr = append(r.storeErr, e) })
}

// take returns the requests recorded since the last take, after checking
// that each one's core events came exactly once and in order: start,
// claim (only with Outcome.Claimed), outcome, end.
func (h *recHook) take(t *testing.T) []*recReq {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	out := h.reqs
	h.reqs = nil
	if len(h.loose) > 0 {
		t.Errorf("events outside a request's context: %v", h.loose)
		h.loose = nil
	}
	for i, r := range out {
		var core []string
		for _, k := range r.kinds {
			if k == "start" || k == "claim" || k == "outcome" || k == "end" {
				core = append(core, k)
			}
		}
		want := []string{"start", "outcome", "end"}
		if r.outcome.Claimed {
			want = []string{"start", "claim", "outcome", "end"}
		}
		if !slices.Equal(core, want) {
			t.Errorf("request %d (%s): events %v, want %v", i, r.start.MessageID, r.kinds, want)
		}
		if r.kinds[0] != "start" || r.kinds[len(r.kinds)-1] != "end" {
			t.Errorf("request %d: events %v do not start with start and end with end", i, r.kinds)
		}
	}
	return out
}

// one returns the single request recorded since the last take.
func (h *recHook) one(t *testing.T) *recReq {
	t.Helper()
	rs := h.take(t)
	if len(rs) != 1 {
		t.Fatalf("%d requests reported, want 1", len(rs))
	}
	return rs[0]
}

// none checks that nothing was reported since the last take.
func (h *recHook) none(t *testing.T) {
	t.Helper()
	if rs := h.take(t); len(rs) != 0 {
		t.Fatalf("%d requests reported, want none: %v", len(rs), rs[0].kinds)
	}
}

// wantOutcome checks a request's outcome event.
func wantOutcome(t *testing.T, r *recReq, status idem.Status, reason idem.DuplicateReason, code int, claimed, released bool) {
	t.Helper()
	e := r.outcome
	resp, _ := r.h.response(r.start.MessageID, status)
	if e.Outcome.Status != status || e.Reason != reason || resp.Status != code || e.Claimed != claimed || e.Released != released {
		t.Fatalf("outcome %v reason %q HTTP %d claimed %v released %v (err %v); want %v %q %d %v %v",
			e.Outcome.Status, e.Reason, resp.Status, e.Claimed, e.Released, e.Outcome.Err, status, reason, code, claimed, released)
	}
	if resp.Outcome != status {
		t.Fatalf("response event outcome %v, want %v", resp.Outcome, status)
	}
	if e.Consumer != r.start.Consumer || e.Mode != idem.ModeLease || r.start.Mode != idem.ModeLease || e.Outcome.MessageID != r.start.MessageID {
		t.Fatalf("outcome %+v does not match its start %+v", e, r.start)
	}
	if r.end.Consumer != e.Consumer || r.end.MessageID != r.start.MessageID || r.end.Latency < e.Latency-time.Millisecond {
		t.Fatalf("end %+v does not match the outcome", r.end)
	}
	if e.Outcome.Ack() != (r.end.Err == nil) {
		t.Fatalf("end error %v for a %v outcome", r.end.Err, e.Outcome.Status)
	}
}

// hookBench is a middleware over a memory store with a recording hook,
// served in process.
type hookBench struct {
	t     *testing.T
	rec   *recHook
	m     *idemhttp.Middleware
	h     http.Handler
	store idemdriver.LeaseStore
}

func newHookBench(t *testing.T, store idemdriver.LeaseStore, o idemhttp.Options, next http.Handler) *hookBench {
	t.Helper()
	if store == nil {
		store = idem.NewMemoryStore(nil)
	}
	rec := &recHook{}
	o.Hooks = append(o.Hooks, rec)
	if o.Namespace == "" {
		o.Namespace = "hooks"
	}
	if o.Scope == nil {
		o.Scope = scAuthScope
	}
	if o.PurgeInterval == 0 {
		o.PurgeInterval = -1
	}
	if o.Logger == nil {
		o.Logger = scQuietLogger()
	}
	m, err := idemhttp.New(store, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return &hookBench{t: t, rec: rec, m: m, h: m.Wrap(next), store: store}
}

// do serves one request: POST /x with key (none when ""), body, and the
// Authorization of user A unless user is "-".
func (b *hookBench) do(method, key, body, user string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, "/x", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(idemhttp.HeaderIdempotencyKey, key)
	}
	if user != "-" {
		req.Header.Set("Authorization", "Bearer a")
	}
	w := httptest.NewRecorder()
	b.h.ServeHTTP(w, req)
	return w
}

// markOK is a handler that answers 201 and records whether the request
// context carried the start hook's request.
type markOK struct {
	mu   sync.Mutex
	runs int
	seen []bool
}

func (h *markOK) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	h.runs++
	h.seen = append(h.seen, recFrom(r.Context()) != nil)
	n := h.runs
	h.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%d}`, n)
}

func TestHooksPassThroughEmitNothing(t *testing.T) {
	t.Parallel()
	h := &markOK{}
	b := newHookBench(t, nil, idemhttp.Options{Unscoped: idemhttp.PassUnscoped}, h)
	for _, c := range []struct{ method, key, user string }{
		{http.MethodGet, `"k"`, "A"},      // method not covered
		{http.MethodPost, "", "A"},        // no key, optional
		{http.MethodPut, `"k"`, "A"},      // not in Methods
		{http.MethodPost, `"k"`, "-"},     // PassUnscoped
		{http.MethodOptions, `"k"`, "-"},  // never covered
		{http.MethodPatch, "", "A"},       // no key, optional
		{http.MethodDelete, `"k2"`, "A"},  // not in Methods
		{http.MethodHead, `"k3"`, "A"},    // never covered
		{http.MethodPost, `"k4"`, "-"},    // PassUnscoped again
		{http.MethodGet, `bad key"`, "A"}, // not covered, even with a bad key
	} {
		if w := b.do(c.method, c.key, `{}`, c.user); w.Code != http.StatusCreated {
			t.Fatalf("%+v: %d", c, w.Code)
		}
	}
	b.rec.none(t)
	if h.runs != 10 || slices.Contains(h.seen, true) {
		t.Fatalf("handler runs %d, with a hook context %v", h.runs, h.seen)
	}
	if st := b.m.Stats(); st.PassThrough != 10 {
		t.Fatalf("PassThrough %d", st.PassThrough)
	}
}

func TestHooksProcessedDuplicateMismatch(t *testing.T) {
	t.Parallel()
	h := &markOK{}
	b := newHookBench(t, nil, idemhttp.Options{}, h)
	id := b.m.RecordID("Bearer a", "k1")

	if w := b.do(http.MethodPost, `"k1"`, `{"a":1}`, "A"); w.Code != 201 {
		t.Fatalf("first: %d", w.Code)
	}
	r := b.rec.one(t)
	wantOutcome(t, r, idem.Processed, idem.NotDuplicate, 201, true, false)
	if r.start.Consumer != "idemhttp:hooks" || r.start.MessageID != id || r.start.BatchSize != 0 {
		t.Fatalf("start %+v, want consumer idemhttp:hooks and record ID %q", r.start, id)
	}
	if r.claim.Attempt != 1 || r.claim.Token == 0 || r.claim.MessageID != id || r.outcome.Outcome.Attempt != 1 || len(r.takeover) != 0 {
		t.Fatalf("claim %+v, outcome attempt %d, takeovers %d", r.claim, r.outcome.Outcome.Attempt, len(r.takeover))
	}
	if len(h.seen) != 1 || !h.seen[0] {
		t.Fatal("the handler's request context is not the start hook's")
	}

	w := b.do(http.MethodPost, `"k1"`, `{"a":1}`, "A")
	if w.Code != 201 || w.Header().Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("retry: %d %v", w.Code, w.Header())
	}
	r = b.rec.one(t)
	wantOutcome(t, r, idem.Duplicate, idem.DuplicateCompleted, 201, false, false)
	if r.outcome.Outcome.Attempt != 1 || r.outcome.Outcome.Err != nil {
		t.Fatalf("replay outcome %+v", r.outcome.Outcome)
	}

	if w := b.do(http.MethodPost, `"k1"`, `{"a":2}`, "A"); w.Code != 422 {
		t.Fatalf("other body: %d", w.Code)
	}
	r = b.rec.one(t)
	wantOutcome(t, r, idem.FingerprintMismatch, idem.DuplicateFingerprintMismatch, 422, false, false)
	if err := r.outcome.Outcome.Err; !errors.Is(err, idem.ErrFingerprintMismatch) || !errors.Is(r.end.Err, idem.ErrFingerprintMismatch) {
		t.Fatalf("mismatch error %v, end error %v", err, r.end.Err)
	}
	if h.runs != 1 {
		t.Fatalf("handler ran %d times", h.runs)
	}
}

func TestHooksRejected(t *testing.T) {
	t.Parallel()
	b := newHookBench(t, nil, idemhttp.Options{MaxRequestBytes: 16}, &markOK{})
	for _, c := range []struct {
		name, key, body, user string
		code                  int
		cause, problem        error
	}{
		{"invalid key", `"a" , "b"`, `{}`, "A", 400, idem.ErrInvalidMessageID, idemhttp.ErrKeyInvalid},
		{"no scope", `"k"`, `{}`, "-", 401, nil, idemhttp.ErrScopeMissing},
		{"body too large", `"k"`, `{"a":"0123456789abcdef"}`, "A", 413, idem.ErrInvalidPayload, idemhttp.ErrBodyTooLarge},
	} {
		if w := b.do(http.MethodPost, c.key, c.body, c.user); w.Code != c.code {
			t.Fatalf("%s: %d", c.name, w.Code)
		}
		// Answered before the key reached the store: the core's hooks
		// see nothing, HookResponse sees the problem.
		b.rec.none(t)
		resp, ok := b.rec.response(map[bool]string{true: "", false: b.m.RecordID("Bearer user-a", "k")}[c.name != "body too large"], 0)
		if c.name == "body too large" {
			resp, ok = b.rec.lastResponse()
		}
		if !ok || resp.Status != c.code || resp.Outcome != 0 || !errors.Is(&idemhttp.Problem{Type: resp.Problem}, c.problem) {
			t.Fatalf("%s: response event %+v, want %d %v", c.name, resp, c.code, c.problem)
		}
		_ = c.cause
	}

	// A route that requires the key.
	req := httptest.NewRequest(http.MethodPost, "/x", strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer a")
	w := httptest.NewRecorder()
	b.m.Require(&markOK{}).ServeHTTP(w, req)
	if w.Code != 400 {
		t.Fatalf("required key: %d", w.Code)
	}
	b.rec.none(t)
	if resp, ok := b.rec.response("", 0); !ok || resp.Status != 400 || resp.Problem != idemhttp.ProblemKeyMissing {
		t.Fatalf("missing key: response event %+v", resp)
	}
}

// A duplicate while the first request runs is InProgress (409); with
// Options.Wait it waits and becomes the replay.
func TestHooksInProgressAndWait(t *testing.T) {
	t.Parallel()
	for _, wait := range []bool{false, true} {
		t.Run(fmt.Sprint("wait=", wait), func(t *testing.T) {
			t.Parallel()
			g := scNewGate(t)
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				g.wait(r.Context())
				w.WriteHeader(http.StatusCreated)
			})
			o := idemhttp.Options{}
			if wait {
				o.Wait = time.Minute
			}
			b := newHookBench(t, nil, o, h)
			first := make(chan int, 1)
			go func() { first <- b.do(http.MethodPost, `"k"`, `{}`, "A").Code }()
			g.await(t, 1)
			second := make(chan int, 1)
			go func() { second <- b.do(http.MethodPost, `"k"`, `{}`, "A").Code }()
			if wait {
				for deadline := time.Now().Add(30 * time.Second); b.m.Stats().Waited == 0; {
					if time.Now().After(deadline) {
						t.Fatal("the duplicate never waited")
					}
					time.Sleep(5 * time.Millisecond)
				}
				g.open()
				if c1, c2 := <-first, <-second; c1 != 201 || c2 != 201 {
					t.Fatalf("first %d, waiting duplicate %d", c1, c2)
				}
			} else {
				if c := <-second; c != 409 {
					t.Fatalf("duplicate in flight: %d", c)
				}
				g.open()
				if c := <-first; c != 201 {
					t.Fatalf("first: %d", c)
				}
			}
			rs := b.rec.take(t)
			if len(rs) != 2 {
				t.Fatalf("%d requests reported", len(rs))
			}
			var firstR, dupR *recReq
			for _, r := range rs {
				if r.outcome.Claimed {
					firstR = r
				} else {
					dupR = r
				}
			}
			if firstR == nil || dupR == nil {
				t.Fatal("want one claimed request and one duplicate")
			}
			wantOutcome(t, firstR, idem.Processed, idem.NotDuplicate, 201, true, false)
			if wait {
				wantOutcome(t, dupR, idem.Duplicate, idem.DuplicateCompleted, 201, false, false)
			} else {
				wantOutcome(t, dupR, idem.InProgress, idem.DuplicateInProgress, 409, false, false)
				o := dupR.outcome.Outcome
				if !errors.Is(o.Err, idem.ErrInProgress) || o.RetryAfter < time.Second || o.Attempt != 1 {
					t.Fatalf("in-progress outcome %+v", o)
				}
			}
		})
	}
}

// A 5xx releases the key (Failed, Released); the retry is attempt 2, a
// takeover. A panic releases it too.
func TestHooksReleasedAndTakeover(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	n := 0
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		k := n
		mu.Unlock()
		switch k {
		case 1:
			w.WriteHeader(http.StatusServiceUnavailable)
		case 2:
			panic("boom")
		default:
			w.WriteHeader(http.StatusCreated)
		}
	})
	b := newHookBench(t, nil, idemhttp.Options{}, h)

	if w := b.do(http.MethodPost, `"k"`, `{}`, "A"); w.Code != 503 {
		t.Fatalf("first: %d", w.Code)
	}
	r := b.rec.one(t)
	wantOutcome(t, r, idem.Failed, idem.NotDuplicate, 503, true, true)
	if err := r.outcome.Outcome.Err; err == nil || !strings.Contains(err.Error(), "response 503 released the key") || r.outcome.Outcome.Attempt != 1 {
		t.Fatalf("released error %v, attempt %d", r.outcome.Outcome.Err, r.outcome.Outcome.Attempt)
	}

	if w := b.do(http.MethodPost, `"k"`, `{}`, "A"); w.Code != 500 {
		t.Fatalf("panic: %d", w.Code)
	}
	r = b.rec.one(t)
	wantOutcome(t, r, idem.Failed, idem.NotDuplicate, 500, true, true)
	if !errors.Is(r.outcome.Outcome.Err, idem.ErrHandlerPanic) || r.claim.Attempt != 2 || len(r.takeover) != 1 || r.takeover[0].Attempt != 2 {
		t.Fatalf("panic: error %v, claim %+v, takeovers %+v", r.outcome.Outcome.Err, r.claim, r.takeover)
	}

	if w := b.do(http.MethodPost, `"k"`, `{}`, "A"); w.Code != 201 {
		t.Fatalf("third: %d", w.Code)
	}
	r = b.rec.one(t)
	wantOutcome(t, r, idem.Processed, idem.NotDuplicate, 201, true, false)
	if r.outcome.Outcome.Attempt != 3 || len(r.takeover) != 1 || r.takeover[0].Token != r.claim.Token {
		t.Fatalf("third: attempt %d, takeovers %+v, claim %+v", r.outcome.Outcome.Attempt, r.takeover, r.claim)
	}
}

func TestHooksStoreErrors(t *testing.T) {
	t.Parallel()
	t.Run("acquire", func(t *testing.T) {
		t.Parallel()
		fs := &faultStore{LeaseStore: idem.NewMemoryStore(nil)}
		fs.down.Store(true)
		h := &markOK{}
		b := newHookBench(t, fs, idemhttp.Options{}, h)
		if w := b.do(http.MethodPost, `"k"`, `{}`, "A"); w.Code != 503 {
			t.Fatalf("store down: %d", w.Code)
		}
		r := b.rec.one(t)
		wantOutcome(t, r, idem.Failed, idem.NotDuplicate, 503, false, false)
		if len(r.storeErr) != 1 || r.storeErr[0].Op != "acquire" || !errors.Is(r.storeErr[0].Err, idem.ErrStore) ||
			!errors.Is(r.storeErr[0].Err, errInjected) || r.storeErr[0].MessageID != r.start.MessageID || !errors.Is(r.outcome.Outcome.Err, idem.ErrStore) {
			t.Fatalf("store errors %+v, outcome error %v", r.storeErr, r.outcome.Outcome.Err)
		}
	})
	t.Run("fail open", func(t *testing.T) {
		t.Parallel()
		fs := &faultStore{LeaseStore: idem.NewMemoryStore(nil)}
		fs.down.Store(true)
		h := &markOK{}
		b := newHookBench(t, fs, idemhttp.Options{FailOpen: true}, h)
		if w := b.do(http.MethodPost, `"k"`, `{}`, "A"); w.Code != 201 || h.runs != 1 {
			t.Fatalf("fail open: %d, runs %d", w.Code, h.runs)
		}
		r := b.rec.one(t)
		wantOutcome(t, r, idem.Failed, idem.NotDuplicate, 0, false, false)
		if len(r.storeErr) != 1 {
			t.Fatalf("store errors %+v", r.storeErr)
		}
	})
	t.Run("complete", func(t *testing.T) {
		t.Parallel()
		fs := &faultStore{LeaseStore: idem.NewMemoryStore(nil)}
		fs.failComplete.Store(1)
		b := newHookBench(t, fs, idemhttp.Options{}, &markOK{})
		// The failed final write is retried while the lease is held.
		if w := b.do(http.MethodPost, `"k"`, `{}`, "A"); w.Code != 201 {
			t.Fatalf("complete failed once: %d", w.Code)
		}
		r := b.rec.one(t)
		wantOutcome(t, r, idem.Processed, idem.NotDuplicate, 201, true, false)
		if len(r.storeErr) != 1 || r.storeErr[0].Op != "complete" || r.outcome.Outcome.Err != nil {
			t.Fatalf("store errors %+v, outcome error %v", r.storeErr, r.outcome.Outcome.Err)
		}
	})
	t.Run("release", func(t *testing.T) {
		t.Parallel()
		fs := &faultStore{LeaseStore: idem.NewMemoryStore(nil)}
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fs.dead.Store(true) // Release will fail, and so will renewals
			w.WriteHeader(http.StatusInternalServerError)
		})
		// The release is retried until the lease runs out by the local
		// clock (no renewal lands).
		b := newHookBench(t, fs, idemhttp.Options{Lease: idem.MinLease}, h)
		if w := b.do(http.MethodPost, `"k"`, `{}`, "A"); w.Code != 500 {
			t.Fatalf("release failed: %d", w.Code)
		}
		r := b.rec.one(t)
		wantOutcome(t, r, idem.Failed, idem.NotDuplicate, 500, true, false)
		if len(r.storeErr) < 1 || r.storeErr[0].Op != "release" || !errors.Is(r.outcome.Outcome.Err, idem.ErrStore) {
			t.Fatalf("store errors %+v, outcome error %v", r.storeErr, r.outcome.Outcome.Err)
		}
	})
}

// lostStore reports every lease as lost: renewals and the completion are
// rejected with idem.ErrLeaseLost, as when another attempt took over.
type lostStore struct{ idemdriver.LeaseStore }

func (lostStore) Renew(context.Context, *idemdriver.RenewParams) error {
	return fmt.Errorf("%w: taken over", idem.ErrLeaseLost)
}

func (lostStore) Complete(context.Context, *idemdriver.CompleteParams) error {
	return fmt.Errorf("%w: taken over", idem.ErrLeaseLost)
}

func TestHooksLease(t *testing.T) {
	t.Parallel()
	t.Run("renewed", func(t *testing.T) {
		t.Parallel()
		var rec *recHook
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			for range 2 {
				select {
				case <-rec.renewed:
				case <-time.After(30 * time.Second):
					t.Error("no renewal in 30 s")
				}
			}
			w.WriteHeader(http.StatusCreated)
		})
		b := newHookBench(t, nil, idemhttp.Options{Lease: 300 * time.Millisecond}, h)
		rec = b.rec
		rec.renewed = make(chan struct{}, 8)
		if w := b.do(http.MethodPost, `"k"`, `{}`, "A"); w.Code != 201 {
			t.Fatalf("%d", w.Code)
		}
		r := b.rec.one(t)
		wantOutcome(t, r, idem.Processed, idem.NotDuplicate, 201, true, false)
		if len(r.renewals) < 2 {
			t.Fatalf("%d renewals", len(r.renewals))
		}
		for _, e := range r.renewals {
			if e.Attempt != 1 || e.Token != r.claim.Token || e.MessageID != r.start.MessageID || e.Consumer != "idemhttp:hooks" {
				t.Fatalf("renewal %+v, claim %+v", e, r.claim)
			}
		}
	})
	t.Run("lost", func(t *testing.T) {
		t.Parallel()
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-time.After(30 * time.Second):
				t.Error("the handler's context was not cancelled in 30 s")
			}
			if !errors.Is(context.Cause(r.Context()), idem.ErrLeaseLost) {
				t.Errorf("cause %v", context.Cause(r.Context()))
			}
			w.WriteHeader(http.StatusCreated)
		})
		b := newHookBench(t, lostStore{idem.NewMemoryStore(nil)}, idemhttp.Options{Lease: idem.MinLease}, h)
		w := b.do(http.MethodPost, `"k"`, `{}`, "A")
		if w.Code != 409 {
			t.Fatalf("%d", w.Code)
		}
		r := b.rec.one(t)
		wantOutcome(t, r, idem.Failed, idem.NotDuplicate, 409, true, false)
		if len(r.lost) != 2 || r.lost[0].Op != "renew" || r.lost[1].Op != "complete" || !errors.Is(r.lost[1].Err, idem.ErrLeaseLost) ||
			!errors.Is(r.outcome.Outcome.Err, idem.ErrLeaseLost) || len(r.storeErr) != 0 {
			t.Fatalf("lost %+v, store errors %+v, outcome error %v", r.lost, r.storeErr, r.outcome.Outcome.Err)
		}
	})
}

// Replays that cannot be served: a response over the cap (410, a
// duplicate), an expired key (422, rejected) and a corrupt record (500).
func TestHooksUnservableReplays(t *testing.T) {
	t.Parallel()
	t.Run("not replayable", func(t *testing.T) {
		t.Parallel()
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(bytes.Repeat([]byte("x"), 100))
		})
		b := newHookBench(t, nil, idemhttp.Options{MaxResponseBytes: 10}, h)
		b.do(http.MethodPost, `"k"`, `{}`, "A")
		wantOutcome(t, b.rec.one(t), idem.Processed, idem.NotDuplicate, 201, true, false)
		if w := b.do(http.MethodPost, `"k"`, `{}`, "A"); w.Code != 410 {
			t.Fatalf("retry: %d", w.Code)
		}
		wantOutcome(t, b.rec.one(t), idem.Duplicate, idem.DuplicateCompleted, 410, false, false)
	})
	t.Run("expired", func(t *testing.T) {
		t.Parallel()
		clock := scNewClock()
		b := newHookBench(t, nil, idemhttp.Options{ReplayWindow: time.Hour, Now: clock.Now}, &markOK{})
		b.do(http.MethodPost, `"k"`, `{}`, "A")
		b.rec.one(t)
		clock.Advance(2 * time.Hour)
		if w := b.do(http.MethodPost, `"k"`, `{}`, "A"); w.Code != 422 {
			t.Fatalf("expired: %d", w.Code)
		}
		r := b.rec.one(t)
		// The core found a completed record; the HTTP answer is the
		// tombstone's.
		wantOutcome(t, r, idem.Duplicate, idem.DuplicateCompleted, 422, false, false)
	})
	t.Run("corrupt", func(t *testing.T) {
		t.Parallel()
		b := newHookBench(t, nil, idemhttp.Options{}, &markOK{})
		req := httptest.NewRequest(http.MethodPost, "/x", nil)
		req.Header.Set("Content-Type", "application/json")
		fp, err := idemhttp.Fingerprint(req, strings.NewReader(`{}`), false)
		if err != nil {
			t.Fatal(err)
		}
		id := b.m.RecordID("Bearer a", "k")
		ctx := t.Context()
		ar, err := b.store.Acquire(ctx, &idemdriver.AcquireParams{Consumer: b.m.Consumer(), MessageID: id, Fingerprint: fp, Lease: time.Minute})
		if err != nil || !ar.Acquired {
			t.Fatal(ar, err)
		}
		if err := b.store.Complete(ctx, &idemdriver.CompleteParams{Consumer: b.m.Consumer(), MessageID: id, Token: ar.Token, Result: []byte("garbage"), ContentType: recordContentType(t)}); err != nil {
			t.Fatal(err)
		}
		if w := b.do(http.MethodPost, `"k"`, `{}`, "A"); w.Code != 500 {
			t.Fatalf("corrupt: %d", w.Code)
		}
		r := b.rec.one(t)
		wantOutcome(t, r, idem.Duplicate, idem.DuplicateCompleted, 500, false, false)
		if false {
		}
	})
}

func TestHooksPurge(t *testing.T) {
	t.Parallel()
	b := newHookBench(t, nil, idemhttp.Options{}, &markOK{})
	b.do(http.MethodPost, `"k"`, `{}`, "A")
	b.rec.one(t)
	if _, err := b.m.Purge(t.Context()); err != nil {
		t.Fatal(err)
	}
	b.rec.none(t)
	b.rec.mu.Lock()
	defer b.rec.mu.Unlock()
	if len(b.rec.purges) != 1 || b.rec.purges[0].Consumer != "idemhttp:hooks" || b.rec.purges[0].Err != nil ||
		b.rec.purges[0].RetentionWindow != idemhttp.DefaultRetention {
		t.Fatalf("purges %+v", b.rec.purges)
	}
}

// panicHook panics in every hook method.
type panicHook struct{}

func (panicHook) OnProcessStart(context.Context, idem.ProcessStartEvent) context.Context {
	panic("start hook")
}
func (panicHook) OnProcessEnd(context.Context, idem.ProcessEndEvent) { panic("end hook") }
func (panicHook) OnClaim(context.Context, idem.ClaimEvent)           { panic("claim hook") }
func (panicHook) OnOutcome(context.Context, idem.OutcomeEvent)       { panic("outcome hook") }
func (panicHook) OnLeaseRenewed(context.Context, idem.LeaseEvent)    { panic("renewed hook") }
func (panicHook) OnLeaseTakenOver(context.Context, idem.LeaseEvent)  { panic("takeover hook") }
func (panicHook) OnLeaseLost(context.Context, idem.LeaseEvent)       { panic("lost hook") }
func (panicHook) OnPurge(context.Context, idem.PurgeEvent)           { panic("purge hook") }
func (panicHook) OnStoreError(context.Context, idem.StoreErrorEvent) { panic("store error hook") }

// A hook that panics does not change a request: each panic is recovered
// and logged at error level, and the hooks after it still get every event.
func TestHooksPanickingHook(t *testing.T) {
	t.Parallel()
	var logBuf lockedBuffer
	logger := slog.New(slog.NewTextHandler(&logBuf, &slog.HandlerOptions{Level: slog.LevelError}))
	h := &markOK{}
	b := newHookBench(t, nil, idemhttp.Options{Hooks: []idem.Hook{panicHook{}}, Logger: logger}, h)
	if w := b.do(http.MethodPost, `"k"`, `{}`, "A"); w.Code != 201 {
		t.Fatalf("first: %d %s", w.Code, w.Body)
	}
	w := b.do(http.MethodPost, `"k"`, `{}`, "A")
	if w.Code != 201 || w.Header().Get(idemhttp.HeaderReplayed) != "true" || h.runs != 1 {
		t.Fatalf("retry: %d, handler runs %d", w.Code, h.runs)
	}
	if _, err := b.m.Purge(t.Context()); err != nil {
		t.Fatal(err)
	}
	rs := b.rec.take(t)
	if len(rs) != 2 {
		t.Fatalf("%d requests reported", len(rs))
	}
	wantOutcome(t, rs[0], idem.Processed, idem.NotDuplicate, 201, true, false)
	wantOutcome(t, rs[1], idem.Duplicate, idem.DuplicateCompleted, 201, false, false)
	log := logBuf.String()
	// First request: start, claim, outcome, end; retry: start, outcome,
	// end; the purge.
	if n := strings.Count(log, "hook panicked"); n != 8 {
		t.Fatalf("%d hook panics logged, want 8:\n%s", n, log)
	}
	for _, want := range []string{"start hook", "claim hook", "outcome hook", "end hook", "purge hook", "level=ERROR", "consumer=idemhttp:hooks", "stack="} {
		if !strings.Contains(log, want) {
			t.Fatalf("log lacks %q:\n%s", want, log)
		}
	}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestHooksInvalid(t *testing.T) {
	t.Parallel()
	_, err := idemhttp.New(idem.NewMemoryStore(nil), idemhttp.Options{Namespace: "n", Scope: scAuthScope, Hooks: []idem.Hook{&recHook{}, struct{}{}}})
	if !errors.Is(err, idemhttp.ErrInvalidOptions) || !errors.Is(err, idem.ErrInvalidConfig) || !strings.Contains(err.Error(), "Hooks[1]") {
		t.Fatalf("err %v", err)
	}
	_, err = idemhttp.NewProxy(&url.URL{Scheme: "http", Host: "127.0.0.1:1"}, idem.NewMemoryStore(nil), &idemhttp.ProxyOptions{Options: idemhttp.Options{Hooks: []idem.Hook{42}}})
	if !errors.Is(err, idemhttp.ErrInvalidOptions) {
		t.Fatalf("proxy: err %v", err)
	}
}

// The proxy reports through ProxyOptions.Options.Hooks: an upstream that
// cannot be reached releases the key (Failed, 502), the next request is
// forwarded (Processed, attempt 2), its retry replayed.
func TestHooksProxy(t *testing.T) {
	t.Parallel()
	var up http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	})
	var mu sync.Mutex
	upSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		h := up
		mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	defer upSrv.Close()
	// A listener that is closed: nothing listens on its port.
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL, _ := url.Parse(dead.URL)
	dead.Close()

	u, _ := url.Parse(upSrv.URL)
	rec := &recHook{}
	// The transport dials the dead port for the first request only.
	var dials int
	var dialer net.Dialer
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		mu.Lock()
		dials++
		d := dials
		mu.Unlock()
		if d == 1 {
			addr = deadURL.Host
		}
		return dialer.DialContext(ctx, network, addr)
	}}
	defer tr.CloseIdleConnections()
	p, err := idemhttp.NewProxy(u, idem.NewMemoryStore(nil), &idemhttp.ProxyOptions{Options: idemhttp.Options{Hooks: []idem.Hook{rec}, PurgeInterval: -1, Logger: scQuietLogger()}, Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	post := func() int {
		req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{}`))
		req.Header.Set("Authorization", "Bearer a")
		req.Header.Set(idemhttp.HeaderIdempotencyKey, `"k"`)
		w := httptest.NewRecorder()
		p.ServeHTTP(w, req)
		return w.Code
	}
	if c := post(); c != 502 {
		t.Fatalf("dead upstream: %d", c)
	}
	r := rec.one(t)
	wantOutcome(t, r, idem.Failed, idem.NotDuplicate, 502, true, true)
	if !strings.HasPrefix(r.start.Consumer, "idemhttp:proxy:127.0.0.1:") {
		t.Fatalf("consumer %q", r.start.Consumer)
	}
	if c := post(); c != 201 {
		t.Fatalf("upstream back: %d", c)
	}
	r = rec.one(t)
	wantOutcome(t, r, idem.Processed, idem.NotDuplicate, 201, true, false)
	if r.outcome.Outcome.Attempt != 2 || len(r.takeover) != 1 {
		t.Fatalf("attempt %d, takeovers %d", r.outcome.Outcome.Attempt, len(r.takeover))
	}
	if c := post(); c != 201 {
		t.Fatalf("retry: %d", c)
	}
	wantOutcome(t, rec.one(t), idem.Duplicate, idem.DuplicateCompleted, 201, false, false)
	// The health path passes by the middleware.
	w := httptest.NewRecorder()
	p.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	rec.none(t)
}

package scenariotest

// The acceptance scenarios of idemhttp (one row each, named by an ID) as a
// table-driven runner, parametrised by the store (testStores) and the front
// (scFronts): the middleware wrapping the test handler H directly, or H
// behind the reverse proxy (proxy_test.go adds that front). Each scenario
// runs as TestScenarios/<store>/<front>/<ID>.
//
// Fronts: a scFront starts one instance serving H with a scConfig and
// returns its URL and hooks. A front for the proxy appends itself to
// scFronts in an init function; scenarios tagged tagMW skip it.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemhttp"
)

// scTag says which fronts run a scenario.
type scTag int

const (
	tagMW   scTag = iota + 1 // the middleware only
	tagBoth                  // the middleware and the proxy
)

// scConfig configures one instance.
type scConfig struct {
	// opts are the middleware options. Namespace is filled in when empty
	// (a fresh one per instance); Scope, when nil, is the front's default
	// (the Authorization header); PurgeInterval, when zero, is -1.
	opts idemhttp.Options
	// require makes the key mandatory (Middleware.Require).
	require bool
	// outer wraps the front's handler (MW front only, e.g. an auth layer).
	outer func(http.Handler) http.Handler
	// store overrides the stage's store (e.g. a faultStore or a second
	// handle).
	store idemdriver.LeaseStore
	// renewed, when not nil, receives a value per lease renewal (from the
	// recording hook; a renewal finding the channel full is not sent).
	renewed chan struct{}
}

// scInstance is one running front.
type scInstance struct {
	URL string
	// purge purges the instance's namespace.
	purge func(ctx context.Context) (idem.PurgeResult, error)
	// stats returns the middleware's counters; nil when not available.
	stats func() idemhttp.Stats
	// record returns the store identity of a user's key.
	record func(user, key string) (consumer, id string)
}

// scFront starts instances of one front.
type scFront struct {
	name  string
	proxy bool
	start func(t *testing.T, store idemdriver.LeaseStore, h http.Handler, cfg scConfig) *scInstance
}

// scFronts are the fronts every tagBoth scenario runs on.
var scFronts = []scFront{{name: "mw", start: startMiddlewareFront}}

// scUsers maps a test user to its Authorization header.
var scUsers = map[string]string{"A": "Bearer user-a", "B": "Bearer user-b", "A2": "Bearer user-a2"}

// scAuthScope is the MW front's default scope: the Authorization header.
func scAuthScope(r *http.Request) (string, error) { return r.Header.Get("Authorization"), nil }

func startMiddlewareFront(t *testing.T, store idemdriver.LeaseStore, h http.Handler, cfg scConfig) *scInstance {
	t.Helper()
	o := cfg.opts
	if o.Scope == nil {
		o.Scope = scAuthScope
	}
	m, err := idemhttp.New(store, o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	var hh http.Handler
	if cfg.require {
		hh = m.Require(h)
	} else {
		hh = m.Wrap(h)
	}
	if cfg.outer != nil {
		hh = cfg.outer(hh)
	}
	srv := httptest.NewServer(hh)
	t.Cleanup(srv.Close)
	return &scInstance{
		URL:   srv.URL,
		purge: m.Purge,
		stats: m.Stats,
		record: func(user, key string) (string, string) {
			return m.Consumer(), m.RecordID(scUsers[user], key)
		},
	}
}

// scLease is the lease of the scenarios that wait for one to run out
// ("T+61s" becomes "after scLease"): short enough to keep the tests fast,
// long enough that a renewal on a store loaded by the other parallel
// scenarios (and other packages' tests) still lands in time.
const scLease = 5 * time.Second

// scenario is one acceptance scenario.
type scenario struct {
	id  string
	tag scTag
	run func(t *testing.T, s *scStage)
}

// scStage is what a scenario runs against.
type scStage struct {
	t      *testing.T
	env    testStoreEnv
	front  scFront
	store  string
	ns     string
	nsN    atomic.Int32
	client *http.Client
	full   bool // run the full-size variant of a large scenario
}

// newNS returns a fresh namespace.
func (s *scStage) newNS() string {
	return fmt.Sprintf("%s-%d", s.ns, s.nsN.Add(1))
}

// start starts an instance of the stage's front serving h.
func (s *scStage) start(h http.Handler, cfg scConfig) *scInstance {
	s.t.Helper()
	if cfg.opts.Namespace == "" {
		cfg.opts.Namespace = s.newNS()
	}
	if cfg.opts.PurgeInterval == 0 {
		cfg.opts.PurgeInterval = -1
	}
	if cfg.opts.Logger == nil {
		cfg.opts.Logger = scQuietLogger()
	}
	if cfg.opts.StoreTimeout == 0 {
		cfg.opts.StoreTimeout = 30 * time.Second // the test machine is loaded
	}
	store := cfg.store
	if store == nil {
		store = s.env.store
	}
	// Every scenario also checks the hooks: each request on the
	// idempotency path reported exactly once (start, claim when it ran the
	// handler, outcome, end), claims as many as Stats.Executed, Processed
	// outcomes as many as Stats.Completed. The check runs at cleanup,
	// after the front's servers have closed (they wait for the requests
	// in flight).
	var inst *scInstance
	if cfg.opts.Hooks == nil {
		rec := &recHook{renewed: cfg.renewed}
		cfg.opts.Hooks = []idem.Hook{rec}
		s.t.Cleanup(func() { scCheckHooks(s.t, rec, inst) })
	}
	inst = s.front.start(s.t, store, h, cfg)
	return inst
}

// scCheckHooks checks what rec recorded against the instance's counters.
func scCheckHooks(t *testing.T, rec *recHook, inst *scInstance) {
	t.Helper()
	if inst == nil || inst.stats == nil {
		return
	}
	var claims, processed int64
	for _, r := range rec.take(t) {
		if r.outcome.Claimed {
			claims++
		}
		if r.outcome.Outcome.Status == idem.Processed {
			processed++
		}
	}
	st := inst.stats()
	if claims != st.Executed || processed != st.Completed+st.Unknown {
		t.Errorf("hooks: %d claims, %d processed; Stats: %d executed, %d completed, %d outcome-unknown", claims, processed, st.Executed, st.Completed, st.Unknown)
	}
}

// scReq is one request.
type scReq struct {
	method string // default POST
	path   string // default /x
	key    string // raw Idempotency-Key value; "" sends none
	keys   []string
	lower  bool   // send the header name in lowercase
	body   string // default {"a":1}
	noBody bool
	chunk  bool   // send the body chunked (unknown length)
	user   string // default A; "-" sends no Authorization
	ct     string // default application/json
	expect bool   // Expect: 100-continue
	header map[string]string
	ctx    context.Context
}

// scResp is a response, read in full.
type scResp struct {
	status int
	header http.Header
	body   []byte
	got100 bool
	err    error
}

// sf returns k as an sf-string header value.
func scKey(k string) string { return `"` + k + `"` }

func (s *scStage) do(inst *scInstance, q scReq) scResp {
	if q.method == "" {
		q.method = http.MethodPost
	}
	if q.path == "" {
		q.path = "/x"
	}
	if q.body == "" && !q.noBody {
		q.body = `{"a":1}`
	}
	if q.user == "" {
		q.user = "A"
	}
	if q.ct == "" {
		q.ct = "application/json"
	}
	ctx := q.ctx
	if ctx == nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
	}
	var body io.Reader = strings.NewReader(q.body)
	if q.chunk {
		body = io.MultiReader(strings.NewReader(q.body)) // hides the length
	}
	if q.noBody {
		body = nil
	}
	var got100 atomic.Bool
	if q.expect {
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{Got100Continue: func() { got100.Store(true) }})
	}
	req, err := http.NewRequestWithContext(ctx, q.method, inst.URL+q.path, body)
	if err != nil {
		s.t.Fatalf("NewRequest: %v", err)
	}
	if !q.noBody {
		req.Header.Set("Content-Type", q.ct)
	}
	if q.user != "-" {
		req.Header.Set("Authorization", scUsers[q.user])
	}
	if q.key != "" {
		if q.lower {
			req.Header["idempotency-key"] = []string{q.key}
		} else {
			req.Header.Set(idemhttp.HeaderIdempotencyKey, q.key)
		}
	}
	for _, k := range q.keys {
		req.Header.Add(idemhttp.HeaderIdempotencyKey, k)
	}
	if q.expect {
		req.Header.Set("Expect", "100-continue")
	}
	for k, v := range q.header {
		req.Header.Set(k, v)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return scResp{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return scResp{status: resp.StatusCode, header: resp.Header, body: b, got100: got100.Load(), err: err}
}

// must fails the test when the request itself failed.
func (r scResp) must(t *testing.T) scResp {
	t.Helper()
	if r.err != nil {
		t.Fatalf("request failed: %v", r.err)
	}
	return r
}

func scWantStatus(t *testing.T, r scResp, status int) {
	t.Helper()
	if r.err != nil {
		t.Fatalf("request failed: %v (want %d)", r.err, status)
	}
	if r.status != status {
		t.Fatalf("status %d, want %d; body %.300s", r.status, status, r.body)
	}
}

func scWantReplayed(t *testing.T, r scResp, replayed bool) {
	t.Helper()
	if got := r.header.Get(idemhttp.HeaderReplayed) == "true"; got != replayed {
		t.Fatalf("%s = %q, want replayed=%v (status %d, body %.200s)", idemhttp.HeaderReplayed, r.header.Get(idemhttp.HeaderReplayed), replayed, r.status, r.body)
	}
}

// wantProblem checks a problem response (scenario J1's rules) and
// returns it.
func scWantProblem(t *testing.T, r scResp, status int, typ string) *idemhttp.Problem {
	t.Helper()
	scWantStatus(t, r, status)
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json", ct)
	}
	if cc := r.header.Get("Cache-Control"); cc != "no-store" {
		t.Fatalf("Cache-Control %q, want no-store", cc)
	}
	if r.header.Get(idemhttp.HeaderReplayed) != "" {
		t.Fatalf("a problem carries %s", idemhttp.HeaderReplayed)
	}
	var p idemhttp.Problem
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatalf("problem body %q: %v", r.body, err)
	}
	if p.Type != typ || p.Status != status || p.Title == "" || p.Detail == "" {
		t.Fatalf("problem %+v, want type %s status %d with title and detail", p, typ, status)
	}
	if status == http.StatusConflict || status == http.StatusServiceUnavailable {
		ra, err := strconv.Atoi(r.header.Get("Retry-After"))
		if err != nil || ra < 1 {
			t.Fatalf("Retry-After %q, want >= 1 second", r.header.Get("Retry-After"))
		}
	}
	return &p
}

// scHandler is the test handler H: it counts its calls (n, and per path),
// reads the whole body, and answers 201 {"id":n} with Location: /x/n
// unless fn answers.
type scHandler struct {
	n     atomic.Int64
	mu    sync.Mutex
	paths map[string]int
	infos []idemhttp.Info
	keys  []string
	fn    func(w http.ResponseWriter, r *http.Request, n int64, body []byte)
}

func scNewH(fn func(w http.ResponseWriter, r *http.Request, n int64, body []byte)) *scHandler {
	return &scHandler{paths: map[string]int{}, fn: fn}
}

func (h *scHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	n := h.n.Add(1)
	h.mu.Lock()
	h.paths[r.URL.Path]++
	if i, ok := idemhttp.FromContext(r.Context()); ok {
		h.infos = append(h.infos, i)
		h.keys = append(h.keys, i.Key)
	} else {
		h.keys = append(h.keys, r.Header.Get(idemhttp.HeaderIdempotencyKey))
	}
	h.mu.Unlock()
	if h.fn != nil {
		h.fn(w, r, n, body)
		return
	}
	scCreated(w, n)
}

func scCreated(w http.ResponseWriter, n int64) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/x/%d", n))
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%d}`, n)
}

func (h *scHandler) count() int64 { return h.n.Load() }

func (h *scHandler) path(p string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.paths[p]
}

// info returns the Info of the i-th call, when the handler saw one (the
// MW front; behind the proxy the upstream has none).
func (h *scHandler) info(i int) (idemhttp.Info, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if i < len(h.infos) {
		return h.infos[i], true
	}
	return idemhttp.Info{}, false
}

func scWantN(t *testing.T, h *scHandler, n int64) {
	t.Helper()
	if got := h.count(); got != n {
		t.Fatalf("handler ran %d times, want %d", got, n)
	}
}

// scGate blocks handler calls until released.
type scGate struct {
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func scNewGate(t *testing.T) *scGate {
	g := &scGate{entered: make(chan struct{}, 1000), release: make(chan struct{})}
	t.Cleanup(g.open)
	return g
}

// wait is called by a handler: it signals entry and blocks until the gate
// opens or ctx ends (30 s at most).
func (g *scGate) wait(ctx context.Context) {
	g.entered <- struct{}{}
	t := time.NewTimer(30 * time.Second)
	defer t.Stop()
	select {
	case <-g.release:
	case <-ctx.Done():
	case <-t.C:
	}
}

func (g *scGate) open() { g.once.Do(func() { close(g.release) }) }

// await waits for n handler entries.
func (g *scGate) await(t *testing.T, n int) {
	t.Helper()
	for i := range n {
		select {
		case <-g.entered:
		case <-time.After(30 * time.Second):
			t.Fatalf("only %d of %d handler calls entered", i, n)
		}
	}
}

// peek reports the record of user's key: its Acquire result and whether
// it existed. It must be the scenario's last look at the key: a missing
// record is created by the probe.
func (s *scStage) peek(inst *scInstance, user, key string) (idemdriver.AcquireResult, bool) {
	s.t.Helper()
	consumer, id := inst.record(user, key)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ar, err := s.env.store.Acquire(ctx, &idemdriver.AcquireParams{Consumer: consumer, MessageID: id, Fingerprint: []byte("peek"), Lease: time.Second})
	if err != nil {
		s.t.Fatalf("peek: %v", err)
	}
	return ar, !ar.Acquired
}

// parallel sends n requests at once and returns their responses in order.
func (s *scStage) parallel(n int, f func(i int) scResp) []scResp {
	out := make([]scResp, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			out[i] = f(i)
		})
	}
	close(start)
	wg.Wait()
	return out
}

// untilNot409 repeats a request until it gets something other than 409.
func (s *scStage) untilNot409(inst *scInstance, q scReq) scResp {
	s.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := s.do(inst, q).must(s.t)
		if r.status != http.StatusConflict || time.Now().After(deadline) {
			return r
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestScenarios runs every scenario on every store and front.
func TestScenarios(t *testing.T) {
	for _, st := range testStores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			var env testStoreEnv
			if !st.perTest {
				env = st.open(t)
			}
			for _, fr := range scFronts {
				t.Run(fr.name, func(t *testing.T) {
					t.Parallel()
					for _, sc := range scenarios {
						if fr.proxy && sc.tag == tagMW {
							continue
						}
						t.Run(sc.id, func(t *testing.T) {
							t.Parallel()
							env := env
							if st.perTest {
								env = st.open(t)
							}
							runScenario(t, env, fr, st.name, sc, false)
						})
					}
				})
			}
		})
	}
}

// runScenario runs sc on one store and front; full runs the full-size
// variant of a large scenario.
func runScenario(t *testing.T, env testStoreEnv, fr scFront, store string, sc scenario, full bool) {
	tr := &http.Transport{MaxIdleConnsPerHost: 200, ExpectContinueTimeout: 10 * time.Second}
	t.Cleanup(tr.CloseIdleConnections)
	s := &scStage{t: t, env: env, front: fr, store: store, ns: testRandName(sc.id + "-"), client: &http.Client{Transport: tr}, full: full}
	sc.run(t, s)
}

// scLarge are the scenarios with a full-size variant (see large).
var scLarge = map[string]bool{"H4": true}

// TestScenariosFullSize runs the full-size variant of the large scenarios
// on the memory store (the store is irrelevant to the size), alone: it is
// not parallel, so it runs while every parallel test is paused. Under the
// race detector, tens of MiB in flight cost garbage collections that stall
// the whole process for seconds, which would make the scenarios that keep
// a lease by real time (E1, E3, G3) lose it.
func TestScenariosFullSize(t *testing.T) {
	for _, fr := range scFronts {
		for _, sc := range scenarios {
			if !scLarge[sc.id] || fr.proxy && sc.tag == tagMW {
				continue
			}
			t.Run(fr.name+"/"+sc.id, func(t *testing.T) {
				runScenario(t, testStores[0].open(t), fr, testStores[0].name, sc, true)
			})
		}
	}
}

// large reports whether the stage runs the full-size variant of a large
// scenario (TestScenariosFullSize); TestScenarios runs a scaled-down one.
func (s *scStage) large() bool { return s.full }

var scenarios = []scenario{
	// A. Header syntax and method scope.
	{"A1", tagBoth, func(t *testing.T, s *scStage) {
		h := scNewH(nil)
		inst := s.start(h, scConfig{})
		const key = "8e03978e-40d5-43e8-bc93-6894a57f9324"
		r := s.do(inst, scReq{key: scKey(key)})
		scWantStatus(t, r, 201)
		scWantReplayed(t, r, false)
		scWantN(t, h, 1)
		if ar, ok := s.peek(inst, "A", key); !ok || ar.State != idemdriver.StateCompleted {
			t.Fatalf("record %+v (exists %v), want completed", ar, ok)
		}
	}},
	{"A2", tagBoth, func(t *testing.T, s *scStage) {
		h := scNewH(nil)
		strict := s.start(h, scConfig{opts: idemhttp.Options{StrictKey: true}})
		scWantProblem(t, s.do(strict, scReq{key: "abc-123"}), 400, idemhttp.ProblemKeyInvalid)
		scWantN(t, h, 0)
		lenient := s.start(h, scConfig{})
		scWantStatus(t, s.do(lenient, scReq{key: "abc-123"}), 201)
		scWantN(t, h, 1)
		if h.keys[0] != "abc-123" {
			t.Fatalf("handler saw key %q, want abc-123", h.keys[0])
		}
		r := s.do(lenient, scReq{key: "abc-123"})
		scWantStatus(t, r, 201)
		scWantReplayed(t, r, true)
	}},
	{"A4", tagBoth, func(t *testing.T, s *scStage) {
		h := scNewH(nil)
		inst := s.start(h, scConfig{})
		scWantProblem(t, s.do(inst, scReq{key: `""`}), 400, idemhttp.ProblemKeyInvalid)
		scWantProblem(t, s.do(inst, scReq{header: map[string]string{idemhttp.HeaderIdempotencyKey: "   "}}), 400, idemhttp.ProblemKeyInvalid)
		scWantProblem(t, s.do(inst, scReq{key: `"   "`}), 400, idemhttp.ProblemKeyInvalid)
		scWantN(t, h, 0)
	}},
	{"A5", tagBoth, func(t *testing.T, s *scStage) {
		h := scNewH(nil)
		inst := s.start(h, scConfig{})
		scWantStatus(t, s.do(inst, scReq{key: scKey(strings.Repeat("k", 255))}), 201)
		scWantProblem(t, s.do(inst, scReq{key: scKey(strings.Repeat("k", 256))}), 400, idemhttp.ProblemKeyInvalid)
		scWantN(t, h, 1)
	}},
	{"A7", tagBoth, func(t *testing.T, s *scStage) {
		h := scNewH(nil)
		inst := s.start(h, scConfig{})
		scWantProblem(t, s.do(inst, scReq{keys: []string{`"a"`, `"b"`}}), 400, idemhttp.ProblemKeyInvalid)
		scWantProblem(t, s.do(inst, scReq{key: `"a", "b"`}), 400, idemhttp.ProblemKeyInvalid)
		scWantN(t, h, 0)
	}},
	{"A8", tagBoth, func(t *testing.T, s *scStage) {
		h := scNewH(nil)
		inst := s.start(h, scConfig{})
		r1 := s.do(inst, scReq{key: `"abc";v=1`})
		scWantStatus(t, r1, 201)
		r2 := s.do(inst, scReq{key: `"abc"`})
		scWantStatus(t, r2, 201)
		scWantReplayed(t, r2, true)
		if !bytes.Equal(r1.body, r2.body) {
			t.Fatalf("replay %q, want %q", r2.body, r1.body)
		}
		scWantN(t, h, 1)
	}},
	{"A9", tagBoth, func(t *testing.T, s *scStage) {
		h := scNewH(func(w http.ResponseWriter, r *http.Request, n int64, _ []byte) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"n":%d}`, n)
		})
		inst := s.start(h, scConfig{})
		var want int64
		for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodOptions} {
			for range 2 {
				r := s.do(inst, scReq{method: m, key: scKey("k1"), noBody: true})
				want++
				scWantStatus(t, r, 200)
				scWantReplayed(t, r, false)
				scWantN(t, h, want)
			}
		}
		if _, ok := s.peek(inst, "A", "k1"); ok {
			t.Fatal("a record exists for a GET/HEAD/OPTIONS key")
		}
	}},
	{"A10", tagBoth, func(t *testing.T, s *scStage) {
		h := scNewH(nil)
		def := s.start(h, scConfig{})
		for _, m := range []string{http.MethodPut, http.MethodDelete} {
			scWantReplayed(t, s.do(def, scReq{method: m, key: scKey("k-" + m)}), false)
			scWantReplayed(t, s.do(def, scReq{method: m, key: scKey("k-" + m)}), false)
		}
		scWantN(t, h, 4)
		all := s.start(h, scConfig{opts: idemhttp.Options{Methods: []string{"POST", "PATCH", "PUT", "DELETE"}}})
		for _, m := range []string{http.MethodPut, http.MethodDelete} {
			scWantReplayed(t, s.do(all, scReq{method: m, key: scKey("k-" + m)}), false)
			r := s.do(all, scReq{method: m, key: scKey("k-" + m)})
			scWantStatus(t, r, 201)
			scWantReplayed(t, r, true)
		}
		scWantN(t, h, 6)
	}},
	{"A11", tagBoth, func(t *testing.T, s *scStage) {
		h := scNewH(nil)
		opt := s.start(h, scConfig{})
		r := s.do(opt, scReq{})
		scWantStatus(t, r, 201)
		scWantReplayed(t, r, false)
		scWantN(t, h, 1)
		if opt.stats != nil && opt.stats().Executed != 0 {
			t.Fatalf("a keyless request took the idempotency path: %+v", opt.stats())
		}
		req := s.start(h, scConfig{require: true})
		scWantProblem(t, s.do(req, scReq{}), 400, idemhttp.ProblemKeyMissing)
		scWantN(t, h, 1)
	}},
	{"A12", tagBoth, func(t *testing.T, s *scStage) {
		h := scNewH(nil)
		inst := s.start(h, scConfig{})
		scWantStatus(t, s.do(inst, scReq{key: scKey("low"), lower: true}), 201)
		r := s.do(inst, scReq{key: scKey("low")})
		scWantStatus(t, r, 201)
		scWantReplayed(t, r, true)
		scWantN(t, h, 1)
	}},

	// B. Replay.
	{"B1", tagBoth, scB1(1)},
	{"B2", tagBoth, scB1(10)},
	{"B3", tagBoth, func(t *testing.T, s *scStage) {
		h := scNewH(func(w http.ResponseWriter, r *http.Request, n int64, _ []byte) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusPaymentRequired)
			io.WriteString(w, `{"error":"card_declined"}`)
		})
		inst := s.start(h, scConfig{})
		r1 := s.do(inst, scReq{key: scKey("k1")})
		scWantStatus(t, r1, 402)
		r2 := s.do(inst, scReq{key: scKey("k1")})
		scWantStatus(t, r2, 402)
		scWantReplayed(t, r2, true)
		if string(r2.body) != `{"error":"card_declined"}` {
			t.Fatalf("replay body %q", r2.body)
		}
		scWantN(t, h, 1)
	}},
	{"B4", tagBoth, func(t *testing.T, s *scStage) {
		h := scNewH(func(w http.ResponseWriter, r *http.Request, n int64, _ []byte) {
			if n == 1 {
				w.Header().Set("Retry-After", "1")
				w.WriteHeader(http.StatusTooManyRequests)
				return
			}
			scCreated(w, n)
		})
		inst := s.start(h, scConfig{})
		scWantStatus(t, s.do(inst, scReq{key: scKey("k1")}), 429)
		r := s.do(inst, scReq{key: scKey("k1")})
		scWantStatus(t, r, 201)
		scWantReplayed(t, r, false)
		scWantN(t, h, 2)
		r = s.do(inst, scReq{key: scKey("k1")})
		scWantStatus(t, r, 201)
		scWantReplayed(t, r, true)
		scWantN(t, h, 2)
	}},
	{"B5", tagMW, func(t *testing.T, s *scStage) {
		h := scNewH(nil)
		auth := func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("Authorization") != scUsers["A"] {
					http.Error(w, "bad token", http.StatusUnauthorized)
					return
				}
				next.ServeHTTP(w, r)
			})
		}
		inst := s.start(h, scConfig{outer: auth})
		scWantStatus(t, s.do(inst, scReq{key: scKey("k1"), user: "B"}), 401)
		r := s.do(inst, scReq{key: scKey("k1")})
		scWantStatus(t, r, 201)
		scWantReplayed(t, r, false)
		scWantN(t, h, 1)
		if _, ok := s.peek(inst, "B", "k1"); ok {
			t.Fatal("the 401 left a record")
		}
	}},
	{"B6", tagBoth, func(t *testing.T, s *scStage) {
		bin := []byte{0xff, 0x00, 0xfe, 0x80, 'a', 0xc3, 0x28, 0x00, 0x01}
		h := scNewH(func(w http.ResponseWriter, r *http.Request, n int64, _ []byte) {
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Header().Add("Set-Cookie", "a=1; Path=/")
			w.Header().Add("Set-Cookie", "b=2; Path=/")
			w.Header().Add("Link", `</x/1>; rel="self"`)
			w.Header().Add("Link", `</x>; rel="collection"`)
			w.WriteHeader(201)
			w.Write(bin)
		})
		inst := s.start(h, scConfig{opts: idemhttp.Options{StoreSetCookie: true}})
		r1 := s.do(inst, scReq{key: scKey("k1")}).must(t)
		r2 := s.do(inst, scReq{key: scKey("k1")})
		scWantStatus(t, r2, 201)
		scWantReplayed(t, r2, true)
		if !bytes.Equal(r2.body, bin) {
			t.Fatalf("replay body %x, want %x", r2.body, bin)
		}
		for _, k := range []string{"Set-Cookie", "Link"} {
			if fmt.Sprint(r2.header.Values(k)) != fmt.Sprint(r1.header.Values(k)) || len(r2.header.Values(k)) != 2 {
				t.Fatalf("%s replayed %q, first %q", k, r2.header.Values(k), r1.header.Values(k))
			}
		}
		scWantN(t, h, 1)
	}},

	// C. Fingerprint and key reuse.
	{"C1", tagBoth, func(t *testing.T, s *scStage) {
		h := scNewH(nil)
		inst := s.start(h, scConfig{})
		r1 := s.do(inst, scReq{key: scKey("k1"), body: `{"a":1}`})
		scWantStatus(t, r1, 201)
		scWantProblem(t, s.do(inst, scReq{key: scKey("k1"), body: `{"a":2}`}), 422, idemhttp.ProblemKeyReused)
		scWantN(t, h, 1)
		r3 := s.do(inst, scReq{key: scKey("k1"), body: `{"a":1}`})
		scWantStatus(t, r3, 201)
		scWantReplayed(t, r3, true)
		if !bytes.Equal(r3.body, r1.body) {
			t.Fatalf("replay %q, want %q", r3.body, r1.body)
		}
	}},
	{"C2", tagBoth, func(t *testing.T, s *scStage) {
		h := scNewH(nil)
		inst := s.start(h, scConfig{})
		scWantStatus(t, s.do(inst, scReq{path: "/x", key: scKey("k1")}), 201)
		r := s.do(inst, scReq{path: "/y", key: scKey("k1")})
		scWantProblem(t, r, 422, idemhttp.ProblemKeyReused)
		if h.path("/y") != 0 {
			t.Fatal("/y ran")
		}
	}},
	{"C3", tagBoth, func(t *testing.T, s *scStage) {
		h := scNewH(nil)
		inst := s.start(h, scConfig{})
		scWantStatus(t, s.do(inst, scReq{path: "/x?q=1", key: scKey("k1")}), 201)
		scWantProblem(t, s.do(inst, scReq{path: "/x?q=2", key: scKey("k1")}), 422, idemhttp.ProblemKeyReused)
		// Parameter order is not significant.
		scWantStatus(t, s.do(inst, scReq{path: "/x?a=1&b=2", key: scKey("k2")}), 201)
		scWantReplayed(t, s.do(inst, scReq{path: "/x?b=2&a=1", key: scKey("k2")}), true)
		scWantN(t, h, 2)
	}},
	{"C4", tagBoth, func(t *testing.T, s *scStage) {
		h := scNewH(nil)
		def := s.start(h, scConfig{})
		scWantStatus(t, s.do(def, scReq{key: scKey("k1"), body: `{"a":1,"b":2}`}), 201)
		scWantProblem(t, s.do(def, scReq{key: scKey("k1"), body: `{ "b":2, "a":1 }`}), 422, idemhttp.ProblemKeyReused)
		canon := s.start(h, scConfig{opts: idemhttp.Options{CanonicalJSON: true}})
		scWantStatus(t, s.do(canon, scReq{key: scKey("k1"), body: `{"a":1,"b":2}`}), 201)
		r := s.do(canon, scReq{key: scKey("k1"), body: `{ "b":2, "a":1 }`})
		scWantStatus(t, r, 201)
		scWantReplayed(t, r, true)
		scWantN(t, h, 2)
	}},
	{"C5", tagBoth, func(t *testing.T, s *scStage) {
		h := scNewH(nil)
		inst := s.start(h, scConfig{})
		scWantReplayed(t, s.do(inst, scReq{key: scKey("k1")}), false)
		r := s.do(inst, scReq{key: scKey("k2")})
		scWantStatus(t, r, 201)
		scWantReplayed(t, r, false)
		scWantN(t, h, 2)
	}},
	{"C7", tagBoth, func(t *testing.T, s *scStage) {
		h := scNewH(nil)
		inst := s.start(h, scConfig{})
		scWantStatus(t, s.do(inst, scReq{key: scKey("k1")}), 201)
		scWantProblem(t, s.do(inst, scReq{method: http.MethodPatch, key: scKey("k1")}), 422, idemhttp.ProblemKeyReused)
		scWantN(t, h, 1)
	}},

	// D. Concurrency.
	{"D1", tagBoth, func(t *testing.T, s *scStage) {
		g := scNewGate(t)
		h := scNewH(func(w http.ResponseWriter, r *http.Request, n int64, _ []byte) {
			g.wait(r.Context())
			scCreated(w, n)
		})
		inst := s.start(h, scConfig{})
		first := make(chan scResp, 1)
		go func() { first <- s.do(inst, scReq{key: scKey("k1")}) }()
		g.await(t, 1)
		scWantProblem(t, s.do(inst, scReq{key: scKey("k1")}), 409, idemhttp.ProblemInProgress)
		g.open()
		r1 := <-first
		scWantStatus(t, r1, 201)
		r := s.do(inst, scReq{key: scKey("k1")})
		scWantStatus(t, r, 201)
		scWantReplayed(t, r, true)
		scWantN(t, h, 1)
	}},
	{"D2", tagBoth, func(t *testing.T, s *scStage) {
		g := scNewGate(t)
		h := scNewH(func(w http.ResponseWriter, r *http.Request, n int64, _ []byte) {
			g.wait(r.Context())
			scCreated(w, n)
		})
		ns := s.newNS()
		a := s.start(h, scConfig{opts: idemhttp.Options{Namespace: ns}})
		b := s.start(h, scConfig{opts: idemhttp.Options{Namespace: ns}, store: s.env.second})
		const n = 100
		var done, conflicts atomic.Int32
		rs := s.parallel(n, func(i int) scResp {
			inst := a
			if i%2 == 1 {
				inst = b
			}
			r := s.do(inst, scReq{key: scKey("k1")})
			if r.status == 409 && conflicts.Add(1) == n-1 {
				g.open() // every duplicate has answered
			}
			done.Add(1)
			return r
		})
		var ok, c409 int
		for _, r := range rs {
			switch r.must(t).status {
			case 201:
				ok++
				scWantReplayed(t, r, false)
			case 409:
				c409++
				scWantProblem(t, r, 409, idemhttp.ProblemInProgress)
			default:
				t.Fatalf("status %d: %s", r.status, r.body)
			}
		}
		if ok != 1 || c409 != n-1 {
			t.Fatalf("%d executions and %d conflicts, want 1 and %d", ok, c409, n-1)
		}
		scWantN(t, h, 1)
	}},
	{"D3", tagBoth, func(t *testing.T, s *scStage) {
		const n = 20
		var inst *scInstance
		h := scNewH(func(w http.ResponseWriter, r *http.Request, k int64, _ []byte) {
			// Hold the response until every duplicate is waiting (or 500 ms
			// when the front has no counters).
			deadline := time.Now().Add(20 * time.Second)
			if inst.stats == nil {
				deadline = time.Now().Add(500 * time.Millisecond)
			}
			for time.Now().Before(deadline) && (inst.stats == nil || inst.stats().Waited < n-1) {
				time.Sleep(20 * time.Millisecond)
			}
			scCreated(w, k)
		})
		inst = s.start(h, scConfig{opts: idemhttp.Options{Wait: 20 * time.Second}})
		rs := s.parallel(n, func(int) scResp { return s.do(inst, scReq{key: scKey("k1")}) })
		fresh := 0
		for _, r := range rs {
			scWantStatus(t, r, 201)
			if string(r.body) != `{"id":1}` {
				t.Fatalf("body %q", r.body)
			}
			if r.header.Get(idemhttp.HeaderReplayed) == "" {
				fresh++
			}
		}
		if fresh != 1 {
			t.Fatalf("%d responses without %s, want 1", fresh, idemhttp.HeaderReplayed)
		}
		scWantN(t, h, 1)

		// A handler slower than the wait: the duplicates get 409 after it.
		g := scNewGate(t)
		h2 := scNewH(func(w http.ResponseWriter, r *http.Request, k int64, _ []byte) {
			g.wait(r.Context())
			scCreated(w, k)
		})
		slow := s.start(h2, scConfig{opts: idemhttp.Options{Wait: 2 * time.Second}})
		first := make(chan scResp, 1)
		go func() { first <- s.do(slow, scReq{key: scKey("k1")}) }()
		g.await(t, 1)
		start := time.Now()
		rs = s.parallel(5, func(int) scResp { return s.do(slow, scReq{key: scKey("k1")}) })
		el := time.Since(start)
		for _, r := range rs {
			scWantProblem(t, r, 409, idemhttp.ProblemInProgress)
		}
		if el < 2*time.Second || el > 20*time.Second {
			t.Fatalf("duplicates answered after %v, want about 2s", el)
		}
		g.open()
		scWantStatus(t, <-first, 201)
		scWantN(t, h2, 1)
	}},
	{"D4", tagBoth, func(t *testing.T, s *scStage) {
		g := scNewGate(t)
		h := scNewH(func(w http.ResponseWriter, r *http.Request, n int64, _ []byte) {
			g.wait(r.Context())
			scCreated(w, n)
		})
		inst := s.start(h, scConfig{})
		first := make(chan scResp, 1)
		go func() { first <- s.do(inst, scReq{key: scKey("k1"), body: `{"a":1}`}) }()
		g.await(t, 1)
		scWantProblem(t, s.do(inst, scReq{key: scKey("k1"), body: `{"a":2}`}), 422, idemhttp.ProblemKeyReused)
		g.open()
		scWantStatus(t, <-first, 201)
		scWantN(t, h, 1)
	}},
	{"D5", tagBoth, func(t *testing.T, s *scStage) {
		g := scNewGate(t)
		h := scNewH(func(w http.ResponseWriter, r *http.Request, n int64, _ []byte) {
			g.wait(r.Context())
			scCreated(w, n)
		})
		inst := s.start(h, scConfig{})
		done := make(chan scResp, 2)
		go func() { done <- s.do(inst, scReq{key: scKey("k1")}) }()
		go func() { done <- s.do(inst, scReq{key: scKey("k2")}) }()
		g.await(t, 2) // both inside the handler at once: no global lock
		g.open()
		scWantStatus(t, <-done, 201)
		scWantStatus(t, <-done, 201)
		scWantN(t, h, 2)
	}},
	{"D7", tagBoth, func(t *testing.T, s *scStage) {
		h := scNewH(nil)
		inst := s.start(h, scConfig{})
		r1 := s.do(inst, scReq{key: scKey("k1")})
		scWantStatus(t, r1, 201)
		const n = 200
		rs := s.parallel(n, func(int) scResp { return s.do(inst, scReq{key: scKey("k1")}) })
		for _, r := range rs {
			scWantStatus(t, r, 201)
			scWantReplayed(t, r, true)
			if !bytes.Equal(r.body, r1.body) {
				t.Fatalf("replay %q", r.body)
			}
		}
		scWantN(t, h, 1)
		if inst.stats != nil {
			if st := inst.stats(); st.Executed != 1 || st.Replayed != n || st.InProgress != 0 || st.Waited != 0 {
				t.Fatalf("stats %+v: a replay took a lease or waited", st)
			}
		}
	}},

	// E. Crash, failure and lease.
	{"E1", tagBoth, func(t *testing.T, s *scStage) {
		g := scNewGate(t)
		h := scNewH(func(w http.ResponseWriter, r *http.Request, n int64, _ []byte) {
			if n == 1 {
				g.wait(r.Context())
			}
			scCreated(w, n)
		})
		ns := s.newNS()
		fs := &faultStore{LeaseStore: s.env.store}
		crashed := s.start(h, scConfig{opts: idemhttp.Options{Namespace: ns, Lease: 2 * scLease}, store: fs})
		other := s.start(h, scConfig{opts: idemhttp.Options{Namespace: ns, Lease: 2 * scLease}, store: s.env.second})
		first := make(chan scResp, 1)
		go func() { first <- s.do(crashed, scReq{key: scKey("k1")}) }()
		g.await(t, 1)
		fs.dead.Store(true) // the process is gone: no renewal, no final write
		scWantProblem(t, s.do(other, scReq{key: scKey("k1")}), 409, idemhttp.ProblemInProgress)
		r := s.untilNot409(other, scReq{key: scKey("k1")})
		if s.front.proxy {
			// At most once across crashes: the takeover finds the first
			// attempt's recovery point and stores upstream-outcome-unknown
			// instead of forwarding again; every retry gets it.
			scWantProblem(t, r, 502, idemhttp.ProblemUpstreamOutcomeUnknown)
			scWantN(t, h, 1)
			g.open()
			<-first
			r = s.do(other, scReq{key: scKey("k1")})
			scWantStatus(t, r, 502)
			scWantReplayed(t, r, true)
			scWantN(t, h, 1)
			return
		}
		scWantStatus(t, r, 201)
		scWantReplayed(t, r, false)
		scWantN(t, h, 2)
		if i1, ok := h.info(0); ok {
			i2, _ := h.info(1)
			if i1.Attempt != 1 || i2.Attempt != 2 || i2.Token <= i1.Token {
				t.Fatalf("attempts %d, %d tokens %d, %d: want 1, 2 and a higher token", i1.Attempt, i2.Attempt, i1.Token, i2.Token)
			}
		}
		g.open()
		<-first
		r = s.do(other, scReq{key: scKey("k1")})
		scWantStatus(t, r, 201)
		scWantReplayed(t, r, true)
		if string(r.body) != `{"id":2}` {
			t.Fatalf("replay %q, want the second attempt's", r.body)
		}
		scWantN(t, h, 2)
	}},
	{"E3", tagBoth, func(t *testing.T, s *scStage) {
		g := scNewGate(t)
		h := scNewH(func(w http.ResponseWriter, r *http.Request, n int64, _ []byte) {
			g.wait(r.Context())
			scCreated(w, n)
		})
		const lease = scLease
		renewed := make(chan struct{}, 16)
		inst := s.start(h, scConfig{opts: idemhttp.Options{Lease: lease}, renewed: renewed})
		first := make(chan scResp, 1)
		go func() { first <- s.do(inst, scReq{key: scKey("k1")}) }()
		g.await(t, 1)
		// The handler outlives its first lease: it was renewed. Renewals
		// come at most every lease/3, so after 8 of them more than 2.5
		// leases have passed since the claim.
		for i := range 8 {
			select {
			case <-renewed:
			case <-time.After(10 * lease):
				t.Fatalf("%d renewals in %v, want 8", i, 10*lease)
			}
		}
		scWantProblem(t, s.do(inst, scReq{key: scKey("k1")}), 409, idemhttp.ProblemInProgress)
		g.open()
		r := <-first
		scWantStatus(t, r, 201)
		scWantN(t, h, 1)
		if i, ok := h.info(0); ok && i.Attempt != 1 {
			t.Fatalf("attempt %d", i.Attempt)
		}
	}},
	{"E4", tagMW, func(t *testing.T, s *scStage) {
		h := scNewH(func(w http.ResponseWriter, r *http.Request, n int64, _ []byte) {
			if n == 1 {
				panic("boom")
			}
			scCreated(w, n)
		})
		inst := s.start(h, scConfig{opts: idemhttp.Options{Logger: scQuietLogger()}})
		scWantProblem(t, s.do(inst, scReq{key: scKey("k1")}), 500, idemhttp.ProblemHandlerPanic)
		r := s.do(inst, scReq{key: scKey("k1")})
		scWantStatus(t, r, 201)
		scWantReplayed(t, r, false)
		scWantN(t, h, 2)
		if i, _ := h.info(1); i.Attempt != 2 {
			t.Fatalf("retry attempt %d, want 2", i.Attempt)
		}
	}},
	{"E6", tagBoth, func(t *testing.T, s *scStage) {
		h := scNewH(nil)
		fs := &faultStore{LeaseStore: s.env.store}
		fs.down.Store(true)
		inst := s.start(h, scConfig{store: fs, opts: idemhttp.Options{Logger: scQuietLogger()}})
		scWantProblem(t, s.do(inst, scReq{key: scKey("k1")}), 503, idemhttp.ProblemUnavailable)
		scWantN(t, h, 0)
		open := s.start(h, scConfig{store: fs, opts: idemhttp.Options{FailOpen: true, Logger: scQuietLogger()}})
		scWantStatus(t, s.do(open, scReq{key: scKey("k1")}), 201)
		scWantN(t, h, 1)
		if open.stats != nil && open.stats().FailOpen != 1 {
			t.Fatalf("FailOpen count %d, want 1", open.stats().FailOpen)
		}
	}},
	{"E7", tagBoth, func(t *testing.T, s *scStage) {
		// A final write that fails once is retried while the lease is
		// held: the client gets the response, the upstream ran once.
		h := scNewH(nil)
		fs := &faultStore{LeaseStore: s.env.store}
		fs.failComplete.Store(2)
		inst := s.start(h, scConfig{store: fs, opts: idemhttp.Options{Lease: 2 * scLease, Logger: scQuietLogger()}})
		scWantStatus(t, s.do(inst, scReq{key: scKey("k1")}), 201)
		scWantN(t, h, 1)
		r := s.do(inst, scReq{key: scKey("k1")})
		scWantStatus(t, r, 201)
		scWantReplayed(t, r, true)
		scWantN(t, h, 1)
	}},
	{"E7b", tagBoth, func(t *testing.T, s *scStage) {
		// A final write that keeps failing until the lease is lost: 503,
		// whose text promises no safe retry. The retry that takes the key
		// over runs it again (the middleware's default, at least once) or,
		// for the proxy (at most once), answers upstream-outcome-unknown.
		h := scNewH(nil)
		fs := &faultStore{LeaseStore: s.env.store}
		fs.failComplete.Store(1 << 30)
		inst := s.start(h, scConfig{store: fs, opts: idemhttp.Options{Lease: 2 * scLease, Logger: scQuietLogger()}})
		r := s.do(inst, scReq{key: scKey("k1")})
		scWantProblem(t, r, 503, idemhttp.ProblemUnavailable)
		if strings.Contains(string(r.body), "; retry with the same key\"") {
			t.Fatalf("the 503 promises a safe retry: %s", r.body)
		}
		scWantN(t, h, 1)
		fs.failComplete.Store(0)
		r = s.untilNot409(inst, scReq{key: scKey("k1")})
		if s.front.proxy {
			scWantProblem(t, r, 502, idemhttp.ProblemUpstreamOutcomeUnknown)
			scWantN(t, h, 1)
			return
		}
		scWantStatus(t, r, 201)
		scWantReplayed(t, r, false)
		scWantN(t, h, 2)
		if i, ok := h.info(1); ok && i.Attempt != 2 {
			t.Fatalf("takeover attempt %d, want 2", i.Attempt)
		}
	}},
	{"E8", tagBoth, func(t *testing.T, s *scStage) {
		h := scNewH(nil)
		inst := s.start(h, scConfig{opts: idemhttp.Options{Logger: scQuietLogger()}})
		ct := recordContentType(t)
		for i, c := range []struct{ ct, result string }{
			{ct, "\x01\x01garbage"},
			{ct, ""},
			{"application/json", `{"status":201}`},
		} {
			key := fmt.Sprintf("corrupt-%d", i)
			s.plantRecord(inst, "A", key, scReq{}, c.ct, []byte(c.result))
			scWantProblem(t, s.do(inst, scReq{key: scKey(key)}), 500, idemhttp.ProblemRecordCorrupt)
		}
		scWantN(t, h, 0)
	}},
	{"E9", tagMW, func(t *testing.T, s *scStage) {
		fail := func(w http.ResponseWriter, r *http.Request, n int64, _ []byte) {
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprintf(w, "failure %d", n)
		}
		h := scNewH(fail)
		rel := s.start(h, scConfig{})
		scWantStatus(t, s.do(rel, scReq{key: scKey("k1")}), 500)
		r := s.do(rel, scReq{key: scKey("k1")})
		scWantStatus(t, r, 500)
		scWantReplayed(t, r, false)
		scWantN(t, h, 2)
		h2 := scNewH(fail)
		store := s.start(h2, scConfig{opts: idemhttp.Options{ReleaseStatus: func(st int) bool { return st == 408 || st == 429 }}})
		scWantStatus(t, s.do(store, scReq{key: scKey("k1")}), 500)
		r = s.do(store, scReq{key: scKey("k1")})
		scWantStatus(t, r, 500)
		scWantReplayed(t, r, true)
		if string(r.body) != "failure 1" {
			t.Fatalf("replay %q", r.body)
		}
		scWantN(t, h2, 1)
	}},

	// F. Tenancy and scope.
	{"F1", tagBoth, func(t *testing.T, s *scStage) {
		h := scNewH(nil)
		inst := s.start(h, scConfig{})
		ra := s.do(inst, scReq{key: scKey("k1"), body: `{"a":1}`, user: "A"})
		rb := s.do(inst, scReq{key: scKey("k1"), body: `{"a":2}`, user: "B"})
		scWantStatus(t, ra, 201)
		scWantStatus(t, rb, 201)
		scWantN(t, h, 2)
		ra2 := s.do(inst, scReq{key: scKey("k1"), body: `{"a":1}`, user: "A"})
		rb2 := s.do(inst, scReq{key: scKey("k1"), body: `{"a":2}`, user: "B"})
		scWantReplayed(t, ra2, true)
		scWantReplayed(t, rb2, true)
		if !bytes.Equal(ra2.body, ra.body) || !bytes.Equal(rb2.body, rb.body) || bytes.Equal(ra.body, rb.body) {
			t.Fatalf("A %q/%q, B %q/%q", ra.body, ra2.body, rb.body, rb2.body)
		}
		scWantN(t, h, 2)
	}},
	{"F2", tagBoth, func(t *testing.T, s *scStage) {
		h := scNewH(nil)
		inst := s.start(h, scConfig{})
		ra := s.do(inst, scReq{key: scKey("k1"), user: "A"})
		rb := s.do(inst, scReq{key: scKey("k1"), user: "B"})
		scWantStatus(t, rb, 201)
		scWantReplayed(t, rb, false)
		if bytes.Equal(ra.body, rb.body) || string(rb.body) != `{"id":2}` {
			t.Fatalf("B got %q (A had %q)", rb.body, ra.body)
		}
		scWantN(t, h, 2)
	}},
	{"F3", tagBoth, func(t *testing.T, s *scStage) {
		g := scNewGate(t)
		h := scNewH(func(w http.ResponseWriter, r *http.Request, n int64, _ []byte) {
			if r.Header.Get("Authorization") == scUsers["A"] {
				g.wait(r.Context())
			}
			scCreated(w, n)
		})
		inst := s.start(h, scConfig{})
		first := make(chan scResp, 1)
		go func() { first <- s.do(inst, scReq{key: scKey("k1"), user: "A"}) }()
		g.await(t, 1)
		r := s.do(inst, scReq{key: scKey("k1"), user: "B"})
		scWantStatus(t, r, 201)
		scWantReplayed(t, r, false)
		g.open()
		scWantStatus(t, <-first, 201)
		scWantN(t, h, 2)
	}},
	{"F4", tagBoth, func(t *testing.T, s *scStage) {
		h := scNewH(nil)
		def := s.start(h, scConfig{})
		scWantProblem(t, s.do(def, scReq{key: scKey("k1"), user: "-"}), 401, idemhttp.ProblemScopeMissing)
		scWantN(t, h, 0)
		pass := s.start(h, scConfig{opts: idemhttp.Options{Unscoped: idemhttp.PassUnscoped}})
		scWantReplayed(t, s.do(pass, scReq{key: scKey("k1"), user: "-"}), false)
		r := s.do(pass, scReq{key: scKey("k1"), user: "-"})
		scWantStatus(t, r, 201)
		scWantReplayed(t, r, false) // no shared anonymous namespace
		scWantN(t, h, 2)
	}},
	{"F5", tagBoth, func(t *testing.T, s *scStage) {
		h := scNewH(nil)
		tenant := func(r *http.Request) (string, error) { return r.Header.Get("X-Tenant"), nil }
		byTenant := s.start(h, scConfig{opts: idemhttp.Options{Scope: tenant}})
		hdr := map[string]string{"X-Tenant": "t1"}
		scWantStatus(t, s.do(byTenant, scReq{key: scKey("k1"), user: "A", header: hdr}), 201)
		r := s.do(byTenant, scReq{key: scKey("k1"), user: "A2", header: hdr})
		scWantReplayed(t, r, true) // documented: same tenant, same key space
		scWantN(t, h, 1)
		byPrincipal := s.start(h, scConfig{})
		scWantReplayed(t, s.do(byPrincipal, scReq{key: scKey("k1"), user: "A", header: hdr}), false)
		scWantReplayed(t, s.do(byPrincipal, scReq{key: scKey("k1"), user: "A2", header: hdr}), false)
		scWantN(t, h, 3)
	}},

	// G. Expiry (retention scaled to seconds; the replay window on a fake
	// clock).
	{"G1", tagBoth, func(t *testing.T, s *scStage) {
		h := scNewH(nil)
		const retention = 2 * time.Second
		inst := s.start(h, scConfig{opts: idemhttp.Options{Retention: retention}})
		scWantStatus(t, s.do(inst, scReq{key: scKey("k1")}), 201)
		s.purge(inst)
		scWantReplayed(t, s.do(inst, scReq{key: scKey("k1")}), true) // "T+23h59m"
		scWantStatus(t, s.do(inst, scReq{key: scKey("k2")}), 201)    // a newer record
		s.purgeSome(inst, retention)
		r := s.do(inst, scReq{key: scKey("k1")}) // "T+24h01m"
		scWantStatus(t, r, 201)
		scWantReplayed(t, r, false)
		scWantN(t, h, 3)
	}},
	{"G2", tagBoth, func(t *testing.T, s *scStage) {
		h := scNewH(nil)
		clk := scNewClock()
		inst := s.start(h, scConfig{opts: idemhttp.Options{Now: clk.Now, Retention: 7 * 24 * time.Hour, ReplayWindow: 24 * time.Hour}})
		scWantStatus(t, s.do(inst, scReq{key: scKey("k1")}), 201)
		clk.Advance(23*time.Hour + 59*time.Minute)
		scWantReplayed(t, s.do(inst, scReq{key: scKey("k1")}), true)
		clk.Advance(time.Hour + time.Minute) // T+25h
		scWantProblem(t, s.do(inst, scReq{key: scKey("k1")}), 422, idemhttp.ProblemKeyExpired)
		scWantN(t, h, 1)
	}},
	{"G3", tagBoth, func(t *testing.T, s *scStage) {
		g := scNewGate(t)
		h := scNewH(func(w http.ResponseWriter, r *http.Request, n int64, _ []byte) {
			if n == 1 {
				g.wait(r.Context())
			}
			scCreated(w, n)
		})
		const retention = time.Second
		inst := s.start(h, scConfig{opts: idemhttp.Options{Retention: retention, Lease: scLease}})
		first := make(chan scResp, 1)
		go func() { first <- s.do(inst, scReq{key: scKey("k2")}) }()
		g.await(t, 1)
		// k3 is claimed and completed after k2 was claimed: once a purge
		// deletes it, the purge horizon is past k2's claim too, and only
		// k2 being in flight keeps it.
		scWantStatus(t, s.do(inst, scReq{key: scKey("k3")}), 201)
		s.purgeSome(inst, retention)
		g.open()
		scWantStatus(t, <-first, 201) // its Complete still owned the record
		r := s.do(inst, scReq{key: scKey("k2")})
		scWantReplayed(t, r, true)
		scWantN(t, h, 2)
	}},
	{"G4", tagBoth, func(t *testing.T, s *scStage) {
		// Retention is counted from completion (the store's stamp). The
		// margins are wide: k2 must complete within a retention of k1.
		const retention = 4 * time.Second
		clk := scNewClock()
		h := scNewH(func(w http.ResponseWriter, r *http.Request, n int64, _ []byte) {
			if n == 1 {
				clk.Advance(10 * time.Minute) // the tombstone clock: completed at T+10m
				time.Sleep(retention + time.Second)
			}
			scCreated(w, n)
		})
		inst := s.start(h, scConfig{opts: idemhttp.Options{Retention: retention, Now: clk.Now}})
		scWantStatus(t, s.do(inst, scReq{key: scKey("k1")}), 201) // created T, completed T+5s
		k1Done := time.Now()
		scWantStatus(t, s.do(inst, scReq{key: scKey("k2")}), 201)
		if lag := time.Since(k1Done); lag > retention-time.Second {
			t.Skipf("the machine stalled %v between two requests: the horizon cannot fall between k1's creation and completion", lag)
		}
		s.purge(inst) // horizon past k1's creation, before its completion
		scWantReplayed(t, s.do(inst, scReq{key: scKey("k1")}), true)
		scWantStatus(t, s.do(inst, scReq{key: scKey("k3")}), 201)
		s.purgeSome(inst, retention)
		r := s.do(inst, scReq{key: scKey("k1")})
		scWantReplayed(t, r, false)
		scWantN(t, h, 4)

		// The replay window is counted from creation: created at T,
		// completed at T+10m, expired at T+24h01m.
		h2 := scNewH(func(w http.ResponseWriter, r *http.Request, n int64, _ []byte) {
			clk.Advance(10 * time.Minute)
			scCreated(w, n)
		})
		tomb := s.start(h2, scConfig{opts: idemhttp.Options{Now: clk.Now, Retention: 48 * time.Hour, ReplayWindow: 24 * time.Hour}})
		scWantStatus(t, s.do(tomb, scReq{key: scKey("k1")}), 201)
		clk.Advance(24*time.Hour - 10*time.Minute + time.Minute)
		scWantProblem(t, s.do(tomb, scReq{key: scKey("k1")}), 422, idemhttp.ProblemKeyExpired)
		scWantN(t, h2, 1)
	}},

	// H. Bodies and streaming.
	{"H1", tagBoth, func(t *testing.T, s *scStage) {
		body := bytes.Repeat([]byte("0123456789abcdef"), 512<<10) // 8 MiB
		want := sha256.Sum256(body)
		h := scNewH(func(w http.ResponseWriter, r *http.Request, n int64, got []byte) {
			if sha256.Sum256(got) != want {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			scCreated(w, n)
		})
		inst := s.start(h, scConfig{opts: idemhttp.Options{MaxRequestBytes: 64 << 20, MemoryBodyBytes: 64 << 10}})
		scWantStatus(t, s.do(inst, scReq{key: scKey("k1"), body: string(body), chunk: true}), 201)
		r := s.do(inst, scReq{key: scKey("k1"), body: string(body), chunk: true})
		scWantStatus(t, r, 201)
		scWantReplayed(t, r, true)
		scWantN(t, h, 1)
	}},
	{"H2", tagBoth, func(t *testing.T, s *scStage) {
		h := scNewH(nil)
		inst := s.start(h, scConfig{opts: idemhttp.Options{MaxRequestBytes: 1024}})
		big := strings.Repeat("x", 1025)
		scWantProblem(t, s.do(inst, scReq{key: scKey("k1"), body: big}), 413, idemhttp.ProblemBodyTooLarge)
		scWantProblem(t, s.do(inst, scReq{key: scKey("k2"), body: big, chunk: true}), 413, idemhttp.ProblemBodyTooLarge)
		scWantStatus(t, s.do(inst, scReq{key: scKey("k3"), body: big[:1024]}), 201)
		scWantN(t, h, 1)
	}},
	{"H4", tagBoth, func(t *testing.T, s *scStage) {
		size, limit := 5<<20, int64(1<<20)
		if s.large() {
			size, limit = 50<<20, 10<<20
		}
		chunk := bytes.Repeat([]byte("abcdefgh"), 4096)
		h := scNewH(func(w http.ResponseWriter, r *http.Request, n int64, _ []byte) {
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Header().Set("Location", fmt.Sprintf("/x/%d", n))
			w.WriteHeader(201)
			for sent := 0; sent < size; sent += len(chunk) {
				w.Write(chunk)
			}
		})
		inst := s.start(h, scConfig{opts: idemhttp.Options{MaxResponseBytes: limit}})
		r := s.do(inst, scReq{key: scKey("k1")})
		scWantStatus(t, r, 201)
		if len(r.body) != size {
			t.Fatalf("client got %d bytes, want %d", len(r.body), size)
		}
		r2 := s.do(inst, scReq{key: scKey("k1")})
		scWantProblem(t, r2, 410, idemhttp.ProblemReplayUnavailable)
		if r2.header.Get("Location") != "/x/1" {
			t.Fatalf("Location %q on the stand-in", r2.header.Get("Location"))
		}
		scWantN(t, h, 1)
	}},
	{"H5", tagBoth, func(t *testing.T, s *scStage) {
		acks := make(chan struct{}, 10)
		h := scNewH(func(w http.ResponseWriter, r *http.Request, n int64, _ []byte) {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusAccepted)
			for i := range 5 {
				fmt.Fprintf(w, "data: event %d\n\n", i)
				w.(http.Flusher).Flush()
				if n == 1 {
					select { // the client has read event i before event i+1 is written
					case <-acks:
					case <-time.After(30 * time.Second):
						return
					}
				}
			}
		})
		inst := s.start(h, scConfig{})
		req, _ := http.NewRequest(http.MethodPost, inst.URL+"/x", strings.NewReader(`{"a":1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", scUsers["A"])
		req.Header.Set(idemhttp.HeaderIdempotencyKey, scKey("k1"))
		resp, err := s.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("status %d", resp.StatusCode)
		}
		br := bufio.NewReader(resp.Body)
		var all strings.Builder
		for i := range 5 {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("event %d: %v", i, err)
			}
			blank, _ := br.ReadString('\n')
			if line != fmt.Sprintf("data: event %d\n", i) {
				t.Fatalf("event %d: %q", i, line)
			}
			all.WriteString(line + blank)
			acks <- struct{}{}
		}
		io.Copy(io.Discard, resp.Body)
		r := s.do(inst, scReq{key: scKey("k1")})
		scWantStatus(t, r, http.StatusAccepted)
		scWantReplayed(t, r, true)
		if string(r.body) != all.String() || r.header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("replay %q (%s), want %q", r.body, r.header.Get("Content-Type"), all.String())
		}
		scWantN(t, h, 1)
	}},
	{"H6", tagMW, func(t *testing.T, s *scStage) {
		var hijackErr atomic.Value
		h := scNewH(func(w http.ResponseWriter, r *http.Request, n int64, _ []byte) {
			if n <= 2 {
				_, _, err := http.NewResponseController(w).Hijack()
				hijackErr.Store(fmt.Sprint(errors.Is(err, idemhttp.ErrHijackNotSupported)))
				if n == 1 {
					http.Error(w, "upgrade refused", http.StatusInternalServerError)
				} else {
					http.Error(w, "upgrade refused", http.StatusBadRequest) // a status that would be stored
				}
				return
			}
			scCreated(w, n)
		})
		inst := s.start(h, scConfig{})
		scWantStatus(t, s.do(inst, scReq{key: scKey("k1")}), 500)
		if hijackErr.Load() != "true" {
			t.Fatal("Hijack did not fail with ErrHijackNotSupported")
		}
		scWantStatus(t, s.do(inst, scReq{key: scKey("k1")}), 400)
		r := s.do(inst, scReq{key: scKey("k1")})
		scWantStatus(t, r, 201) // no record was left behind by either attempt
		scWantN(t, h, 3)
	}},
	{"H7", tagBoth, func(t *testing.T, s *scStage) {
		h := scNewH(nil)
		inst := s.start(h, scConfig{})
		scWantStatus(t, s.do(inst, scReq{key: scKey("k1")}), 201)
		r := s.do(inst, scReq{key: scKey("k1"), expect: true})
		scWantStatus(t, r, 201)
		scWantReplayed(t, r, true)
		if !r.got100 {
			t.Fatal("no 100 Continue")
		}
		scWantProblem(t, s.do(inst, scReq{key: scKey("k1"), expect: true, body: `{"a":2}`}), 422, idemhttp.ProblemKeyReused)
		scWantN(t, h, 1)
	}},

	// J. Error format.
	{"J1", tagBoth, func(t *testing.T, s *scStage) {
		g := scNewGate(t)
		h := scNewH(func(w http.ResponseWriter, r *http.Request, n int64, _ []byte) {
			g.wait(r.Context())
			scCreated(w, n)
		})
		fs := &faultStore{LeaseStore: s.env.store}
		inst := s.start(h, scConfig{store: fs, opts: idemhttp.Options{Logger: scQuietLogger()}})
		types := map[string]bool{}
		types[scWantProblem(t, s.do(inst, scReq{key: `"bad`}), 400, idemhttp.ProblemKeyInvalid).Type] = true
		first := make(chan scResp, 1)
		go func() { first <- s.do(inst, scReq{key: scKey("k1")}) }()
		g.await(t, 1)
		types[scWantProblem(t, s.do(inst, scReq{key: scKey("k1")}), 409, idemhttp.ProblemInProgress).Type] = true
		types[scWantProblem(t, s.do(inst, scReq{key: scKey("k1"), body: `{"a":2}`}), 422, idemhttp.ProblemKeyReused).Type] = true
		g.open()
		scWantStatus(t, <-first, 201)
		fs.down.Store(true)
		types[scWantProblem(t, s.do(inst, scReq{key: scKey("k9")}), 503, idemhttp.ProblemUnavailable).Type] = true
		if len(types) != 4 {
			t.Fatalf("problem types not distinct: %v", types)
		}
	}},
}

// scB1 is B1 with n retries (B2: 10).
func scB1(retries int) func(t *testing.T, s *scStage) {
	return func(t *testing.T, s *scStage) {
		h := scNewH(func(w http.ResponseWriter, r *http.Request, n int64, _ []byte) {
			w.Header().Set("Keep-Alive", "timeout=5")
			w.Header().Set("X-Custom", "yes")
			scCreated(w, n)
		})
		inst := s.start(h, scConfig{})
		r1 := s.do(inst, scReq{key: scKey("k1")})
		scWantStatus(t, r1, 201)
		for range retries {
			r := s.do(inst, scReq{key: scKey("k1")})
			scWantStatus(t, r, 201)
			scWantReplayed(t, r, true)
			if !bytes.Equal(r.body, r1.body) {
				t.Fatalf("replay %q, want %q", r.body, r1.body)
			}
			for _, k := range []string{"Location", "Content-Type", "X-Custom"} {
				if r.header.Get(k) != r1.header.Get(k) || r.header.Get(k) == "" {
					t.Fatalf("%s %q, want %q", k, r.header.Get(k), r1.header.Get(k))
				}
			}
			if r.header.Get("Content-Length") != strconv.Itoa(len(r1.body)) {
				t.Fatalf("Content-Length %q, want %d", r.header.Get("Content-Length"), len(r1.body))
			}
			for _, k := range []string{"Keep-Alive", "Transfer-Encoding", "Connection", "Upgrade", "Trailer"} {
				if v := r.header.Get(k); v != "" {
					t.Fatalf("replay carries hop-by-hop %s: %q", k, v)
				}
			}
		}
		scWantN(t, h, 1)
	}
}

// purge runs a purge of inst's namespace, retrying while another cleaner
// holds the lock.
func (s *scStage) purge(inst *scInstance) idem.PurgeResult {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		res, err := inst.purge(ctx)
		if errors.Is(err, idem.ErrPurgeInProgress) && ctx.Err() == nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if err != nil {
			s.t.Fatalf("purge: %v", err)
		}
		return res
	}
}

// purgeSome purges until a purge deletes something. The horizon follows
// the consumer's heartbeats (at least a second apart), which a loaded
// machine delays, so the test waits for the outcome rather than for a
// fixed time; it fails when nothing went within 20 retention windows.
func (s *scStage) purgeSome(inst *scInstance, retention time.Duration) {
	s.t.Helper()
	deadline := time.Now().Add(20 * retention)
	for res := s.purge(inst); res.Deleted < 1; res = s.purge(inst) {
		if time.Now().After(deadline) {
			s.t.Fatalf("purge deleted nothing %v after the retention window", 20*retention)
		}
		time.Sleep(retention / 10)
	}
}

// plantRecord writes a completed record for user's key as the request q
// would have claimed it, with the given stored result.
func (s *scStage) plantRecord(inst *scInstance, user, key string, q scReq, ct string, result []byte) {
	s.t.Helper()
	if q.body == "" {
		q.body = `{"a":1}`
	}
	r := httptest.NewRequest(http.MethodPost, "/x", nil)
	r.Header.Set("Content-Type", "application/json")
	fp, err := idemhttp.Fingerprint(r, strings.NewReader(q.body), false)
	if err != nil {
		s.t.Fatal(err)
	}
	consumer, id := inst.record(user, key)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ar, err := s.env.store.Acquire(ctx, &idemdriver.AcquireParams{Consumer: consumer, MessageID: id, Fingerprint: fp, Lease: time.Minute})
	if err != nil || !ar.Acquired {
		s.t.Fatalf("plant: acquire %+v %v", ar, err)
	}
	if err := s.env.store.Complete(ctx, &idemdriver.CompleteParams{Consumer: consumer, MessageID: id, Token: ar.Token, Result: result, ContentType: ct}); err != nil {
		s.t.Fatalf("plant: complete: %v", err)
	}
}

// quietLogger discards the middleware's log: the scenarios provoke
// failures on purpose.
func scQuietLogger() *slog.Logger {
	if os.Getenv("IDEMHTTP_TEST_LOG") != "" {
		return slog.Default()
	}
	return slog.New(slog.DiscardHandler)
}

// scClock is a settable clock for Options.Now.
type scClock struct {
	mu sync.Mutex
	t  time.Time
}

func scNewClock() *scClock { return &scClock{t: time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)} }

func (c *scClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *scClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

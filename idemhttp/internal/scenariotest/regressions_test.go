package scenariotest

// Regressions from the field that concern HTTP: each reproduces a
// production failure seen in other idempotency-key implementations and
// asserts idem's behaviour, on every store, through the middleware.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/idemhttp"
)

// forEachStoreMW runs f as a parallel subtest per store, with a stage on
// the middleware front.
func forEachStoreMW(t *testing.T, f func(t *testing.T, s *scStage)) {
	for _, st := range testStores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			tr := &http.Transport{MaxIdleConnsPerHost: 50}
			t.Cleanup(tr.CloseIdleConnections)
			s := &scStage{t: t, env: st.open(t), front: scFronts[0], store: st.name, ns: testRandName("fc-"), client: &http.Client{Transport: tr}}
			f(t, s)
		})
	}
}

// rows is a business table: the side effects a handler commits.
type rows struct {
	mu   sync.Mutex
	rows []string
	down atomic.Bool
}

func (r *rows) insert(v string) error {
	if r.down.Load() {
		return errors.New("database unavailable")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rows = append(r.rows, v)
	return nil
}

func (r *rows) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.rows)
}

// the key was written after a slow commit; the client timed out,
// retried, and a second row was created. Here the key is claimed before
// the handler runs: the retry gets 409, then the replay; one row.
func TestTimeoutRetry(t *testing.T) {
	t.Parallel()
	forEachStoreMW(t, func(t *testing.T, s *scStage) {
		var db rows
		g := scNewGate(t)
		h := scNewH(func(w http.ResponseWriter, r *http.Request, n int64, _ []byte) {
			db.insert(fmt.Sprint(n))     // (a) the business row commits
			g.wait(context.Background()) // (b) slow follow-up work, whether the client waits or not
			scCreated(w, n)
		})
		inst := s.start(h, scConfig{})
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		r := s.do(inst, scReq{key: scKey("K"), ctx: ctx}) // the client gives up after 1 s
		if r.err == nil {
			t.Fatalf("the first request answered %d before the handler finished", r.status)
		}
		scWantProblem(t, s.do(inst, scReq{key: scKey("K")}), 409, idemhttp.ProblemInProgress)
		g.open()
		r = s.untilNot409(inst, scReq{key: scKey("K")})
		scWantStatus(t, r, 201)
		scWantReplayed(t, r, true)
		if db.count() != 1 {
			t.Fatalf("%d business rows, want 1", db.count())
		}
	})
}

// no in-flight claim, so two concurrent requests with one key both
// ran. Here exactly one runs; the other gets 409. Repeated N times.
func TestConcurrentSameKey(t *testing.T) {
	t.Parallel()
	forEachStoreMW(t, func(t *testing.T, s *scStage) {
		n := 20
		if s.store == "memory" {
			n = 100
		}
		var db rows
		var mu sync.Mutex
		gates := map[string]*scGate{}
		gate := func(k string) *scGate {
			mu.Lock()
			defer mu.Unlock()
			if gates[k] == nil {
				gates[k] = scNewGate(t)
			}
			return gates[k]
		}
		h := scNewH(func(w http.ResponseWriter, r *http.Request, k int64, _ []byte) {
			key := r.Header.Get(idemhttp.HeaderIdempotencyKey)
			gate(key).wait(r.Context()) // held until the duplicate has answered
			db.insert(key)
			scCreated(w, k)
		})
		inst := s.start(h, scConfig{})
		for i := range n {
			key := scKey(fmt.Sprintf("K%d", i))
			var conflicts atomic.Int32
			rs := s.parallel(2, func(int) scResp {
				r := s.do(inst, scReq{key: key})
				if r.status == 409 && conflicts.Add(1) == 1 {
					gate(key).open()
				}
				return r
			})
			codes := []int{rs[0].must(t).status, rs[1].must(t).status}
			if !(codes[0] == 201 && codes[1] == 409 || codes[0] == 409 && codes[1] == 201) {
				t.Fatalf("round %d: statuses %v, want one 201 and one 409", i, codes)
			}
		}
		if db.count() != n {
			t.Fatalf("%d rows for %d keys", db.count(), n)
		}
	})
}

// keys were global, so user B replayed user A's response. Here keys
// are scoped (and a Middleware cannot be built without a scope).
func TestCrossUserReplay(t *testing.T) {
	t.Parallel()
	if _, err := idemhttp.New(nil, idemhttp.Options{Namespace: "orders"}); err == nil {
		t.Fatal("New without a store succeeded")
	}
	s0 := testStores[0].open(t)
	if _, err := idemhttp.New(s0.store, idemhttp.Options{Namespace: "orders"}); !errors.Is(err, idemhttp.ErrNoScope) || !errors.Is(err, idemhttp.ErrInvalidOptions) {
		t.Fatalf("New without Scope: %v, want ErrNoScope", err)
	}
	forEachStoreMW(t, func(t *testing.T, s *scStage) {
		h := scNewH(func(w http.ResponseWriter, r *http.Request, n int64, _ []byte) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(201)
			fmt.Fprintf(w, `{"id":"o%d","user":%q}`, n, r.Header.Get("Authorization"))
		})
		inst := s.start(h, scConfig{})
		ra := s.do(inst, scReq{path: "/orders", key: scKey("K"), user: "A"})
		scWantStatus(t, ra, 201)
		for user, body := range map[string]string{"B": `{"a":1}`, "A2": `{"a":2}`} {
			rb := s.do(inst, scReq{path: "/orders", key: scKey("K"), user: user, body: body})
			scWantStatus(t, rb, 201)
			if strings.Contains(string(rb.body), `"Bearer user-a"`) || strings.Contains(string(rb.body), `"o1"`) {
				t.Fatalf("B received A's response: %s", rb.body)
			}
		}
		// B's first request was B's own; its retry replays B's, not A's.
		rb := s.do(inst, scReq{path: "/orders", key: scKey("K"), user: "B"})
		scWantReplayed(t, rb, true)
		if !strings.Contains(string(rb.body), "user-b") {
			t.Fatalf("B's replay %s", rb.body)
		}
	})
}

// a response over the size limit was not stored, so the retry ran
// the handler again. Here it is completed but not replayable: the retry
// gets 410 and the counter stays at 1; a truncated body is never
// replayed.
func TestOversizedResponse(t *testing.T) {
	t.Parallel()
	forEachStoreMW(t, func(t *testing.T, s *scStage) {
		big := strings.Repeat("x", 10<<10)
		h := scNewH(func(w http.ResponseWriter, r *http.Request, n int64, _ []byte) {
			w.Header().Set("Location", fmt.Sprintf("/x/%d", n))
			w.WriteHeader(201)
			w.Write([]byte(big))
		})
		inst := s.start(h, scConfig{opts: idemhttp.Options{MaxResponseBytes: 1 << 10}})
		r := s.do(inst, scReq{key: scKey("K")})
		scWantStatus(t, r, 201)
		if string(r.body) != big {
			t.Fatalf("the first client got %d bytes, want %d", len(r.body), len(big))
		}
		for range 2 {
			p := scWantProblem(t, s.do(inst, scReq{key: scKey("K")}), 410, idemhttp.ProblemReplayUnavailable)
			if !errors.Is(p, idemhttp.ErrReplayUnavailable) {
				t.Fatalf("problem %v does not match ErrReplayUnavailable", p)
			}
		}
		scWantN(t, h, 1)
		if st := inst.stats(); st.NotReplayable != 3 || st.Completed != 1 {
			t.Fatalf("stats %+v", st)
		}
	})
}

// a transient 5xx was stored and replayed until the TTL. Each row of
// the policy: validation 4xx released by the handler, rollback + 5xx
// released, commit + 2xx stored, commit + 5xx stored by the handler.
func TestTransientFailures(t *testing.T) {
	t.Parallel()
	forEachStoreMW(t, func(t *testing.T, s *scStage) {
		var db rows
		h := scNewH(func(w http.ResponseWriter, r *http.Request, n int64, body []byte) {
			switch r.URL.Path {
			case "/validate": // rejected before any effect: let the retry run
				if n == 1 {
					idemhttp.SetDisposition(r.Context(), idemhttp.DispositionRelease)
					http.Error(w, "bad parameter", http.StatusBadRequest)
					return
				}
			case "/rollback":
				if err := db.insert("rollback"); err != nil {
					http.Error(w, err.Error(), http.StatusServiceUnavailable)
					return
				}
			case "/commit5xx": // the row committed, then the handler failed
				db.insert("commit5xx")
				idemhttp.SetDisposition(r.Context(), idemhttp.DispositionStore)
				http.Error(w, "failed after commit", http.StatusInternalServerError)
				return
			default:
				db.insert("commit")
			}
			scCreated(w, n)
		})
		inst := s.start(h, scConfig{})

		scWantStatus(t, s.do(inst, scReq{path: "/validate", key: scKey("V")}), 400)
		scWantReplayed(t, s.do(inst, scReq{path: "/validate", key: scKey("V")}), false)

		db.down.Store(true)
		scWantStatus(t, s.do(inst, scReq{path: "/rollback", key: scKey("R")}), 503)
		db.down.Store(false) // the database is back
		r := s.do(inst, scReq{path: "/rollback", key: scKey("R")})
		scWantStatus(t, r, 201)
		scWantReplayed(t, r, false)

		scWantStatus(t, s.do(inst, scReq{path: "/commit", key: scKey("C")}), 201)
		r = s.do(inst, scReq{path: "/commit", key: scKey("C")})
		scWantStatus(t, r, 201)
		scWantReplayed(t, r, true)

		scWantStatus(t, s.do(inst, scReq{path: "/commit5xx", key: scKey("F")}), 500)
		r = s.do(inst, scReq{path: "/commit5xx", key: scKey("F")})
		scWantStatus(t, r, 500)
		scWantReplayed(t, r, true)

		if db.count() != 3 {
			t.Fatalf("%d rows, want 3 (rollback retry, commit, commit5xx)", db.count())
		}
	})
}

// the duplicate was detected but the replay path ran creation-only
// code and failed with 500. Here a replay never enters the handler: after
// a restart (a new Middleware on the same store), after the resource was
// edited or deleted, and for non-2xx outcomes; and every branch of the
// endpoint is behind the same gate.
func TestReplayPath(t *testing.T) {
	t.Parallel()
	forEachStoreMW(t, func(t *testing.T, s *scStage) {
		var mu sync.Mutex
		resources := map[string]string{}
		h := scNewH(func(w http.ResponseWriter, r *http.Request, n int64, body []byte) {
			id := fmt.Sprintf("s%d", n)
			mu.Lock()
			resources[id] = string(body)
			mu.Unlock()
			if strings.Contains(string(body), "invalid") {
				w.WriteHeader(http.StatusUnprocessableEntity)
				fmt.Fprint(w, `{"error":"invalid status"}`)
				return
			}
			w.Header().Set("Location", "/statuses/"+id)
			w.WriteHeader(201)
			fmt.Fprintf(w, `{"id":%q,"text":%q}`, id, body)
		})
		ns := s.newNS()
		first := s.start(h, scConfig{opts: idemhttp.Options{Namespace: ns}})
		r1 := s.do(first, scReq{path: "/statuses", key: scKey("K"), body: "hello"})
		scWantStatus(t, r1, 201)

		// The resource is edited, then deleted; the process restarts.
		mu.Lock()
		resources["s1"] = "edited"
		delete(resources, "s1")
		mu.Unlock()
		restarted := s.start(h, scConfig{opts: idemhttp.Options{Namespace: ns}, store: s.env.second})
		r2 := s.do(restarted, scReq{path: "/statuses", key: scKey("K"), body: "hello"})
		scWantStatus(t, r2, 201)
		scWantReplayed(t, r2, true)
		if string(r2.body) != string(r1.body) || r2.header.Get("Location") != "/statuses/s1" {
			t.Fatalf("replay %s (Location %q), want the stored snapshot %s", r2.body, r2.header.Get("Location"), r1.body)
		}

		// A non-2xx outcome replays too.
		scWantStatus(t, s.do(restarted, scReq{path: "/statuses", key: scKey("I"), body: "invalid"}), 422)
		r3 := s.do(restarted, scReq{path: "/statuses", key: scKey("I"), body: "invalid"})
		scWantStatus(t, r3, 422)
		scWantReplayed(t, r3, true)

		// The "scheduled" branch is behind the same gate.
		for range 2 {
			scWantStatus(t, s.do(restarted, scReq{path: "/statuses?scheduled=true", key: scKey("S"), body: "later"}), 201)
		}
		scWantN(t, h, 3)
	})
}

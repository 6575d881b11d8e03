package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// handTestStore is a hand-written sidecar's store for a test, with a
// way to read a record's state and token.
type handTestStore struct {
	name  string
	st    handStore
	state func(t *testing.T, id string) (state int16, token int64)
}

// handTestStores opens the hand-written sidecar's stores: SQLite in the
// test's directory, and those whose URLs are set: PostgreSQL on a table
// of the test's own, dropped at its end, and Redis under a key prefix of
// its own, deleted at its end.
func handTestStores(t *testing.T) []handTestStore {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "hand_test_" + hex.EncodeToString(b[:])
	lite, err := newHandSQLite(t.Context(), filepath.Join(t.TempDir(), "hand.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lite.close)
	out := []handTestStore{{"sqlite", lite, func(t *testing.T, id string) (state int16, token int64) {
		t.Helper()
		if err := lite.db.QueryRowContext(t.Context(), `SELECT state, token FROM hand WHERE message_id = ?`, id).Scan(&state, &token); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		return state, token
	}}}
	if url := postgresURL(); url != "" {
		st, err := newHandPG(t.Context(), url, name)
		if err != nil {
			t.Fatal(err)
		}
		table := pgx.Identifier{name}.Sanitize()
		t.Cleanup(func() {
			_, _ = st.pool.Exec(context.Background(), `DROP TABLE `+table)
			st.close()
		})
		out = append(out, handTestStore{"postgres", st, func(t *testing.T, id string) (state int16, token int64) {
			t.Helper()
			if err := st.pool.QueryRow(t.Context(), `SELECT state, token FROM `+table+` WHERE message_id = $1`, id).Scan(&state, &token); err != nil {
				t.Fatalf("%s: %v", id, err)
			}
			return state, token
		}})
	}
	if url := os.Getenv(envRedis); url != "" {
		st, err := newHandRedis(url, name+":")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			keys, _ := st.rdb.Keys(context.Background(), name+":*").Result()
			if len(keys) > 0 {
				st.rdb.Del(context.Background(), keys...)
			}
			st.close()
		})
		out = append(out, handTestStore{"redis", st, func(t *testing.T, id string) (state int16, token int64) {
			t.Helper()
			if err := st.rdb.HMGet(t.Context(), name+":"+id, "state", "token").Scan(&struct {
				State *int16 `redis:"state"`
				Token *int64 `redis:"token"`
			}{&state, &token}); err != nil {
				t.Fatalf("%s: %v", id, err)
			}
			return state, token
		}})
	}
	return out
}

// fakeMsg is a JetStream delivery that records what was done with it;
// only the methods the hand-written sidecar calls are implemented.
type fakeMsg struct {
	jetstream.Msg
	id                  string
	data                []byte
	acks, naks, delayed atomic.Int32
	terms               atomic.Int32
}

func (m *fakeMsg) Headers() nats.Header             { return nats.Header{nats.MsgIdHdr: []string{m.id}} }
func (m *fakeMsg) Data() []byte                     { return m.data }
func (m *fakeMsg) Ack() error                       { m.acks.Add(1); return nil }
func (m *fakeMsg) Nak() error                       { m.naks.Add(1); return nil }
func (m *fakeMsg) NakWithDelay(time.Duration) error { m.delayed.Add(1); return nil }
func (m *fakeMsg) Term() error                      { m.terms.Add(1); return nil }

// countingService answers 200 and counts the POSTs per Idempotency-Key.
type countingService struct {
	mu    sync.Mutex
	calls map[string]int
}

func (s *countingService) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.calls[r.Header.Get("Idempotency-Key")]++
	s.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

func (s *countingService) count(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[id]
}

func handFP(payload string) []byte {
	fp := sha256.Sum256([]byte(payload))
	return fp[:]
}

// TestHandSidecarDuplicateNotCalledAgain, on each store: a message completed in one
// batch and delivered again in a later one is acked without a call; one
// another claim holds is left to be redelivered, without a call or an
// ack; each batch is two store round trips.
func TestHandSidecarDuplicateNotCalledAgain(t *testing.T) {
	for _, ts := range handTestStores(t) {
		t.Run(ts.name, func(t *testing.T) { testHandDuplicate(t, ts) })
	}
}

func testHandDuplicate(t *testing.T, ts handTestStore) {
	st := ts.st
	svc := &countingService{calls: map[string]int{}}
	srv := httptest.NewServer(svc)
	defer srv.Close()
	h := newHandSidecar(nil, nil, st, srv.URL, "dead", 8)
	defer h.client.CloseIdleConnections()
	ctx := t.Context()

	a, b := &fakeMsg{id: "a", data: []byte("1")}, &fakeMsg{id: "b", data: []byte("2")}
	h.handle(ctx, []jetstream.Msg{a, b})
	if svc.count("a") != 1 || svc.count("b") != 1 || a.acks.Load() != 1 || b.acks.Load() != 1 {
		t.Fatalf("first batch: calls a %d b %d, acks a %d b %d; want 1 each", svc.count("a"), svc.count("b"), a.acks.Load(), b.acks.Load())
	}
	if s, tok := ts.state(t, "a"); s != handCompleted || tok != 1 {
		t.Fatalf("a: state %d token %d, want %d 1", s, tok, handCompleted)
	}

	// c is held by a live claim of someone else.
	if _, err := st.claim(ctx, []handMsg{{"c", handFP("3")}}, time.Hour); err != nil {
		t.Fatal(err)
	}
	again, c, d := &fakeMsg{id: "a", data: []byte("1")}, &fakeMsg{id: "c", data: []byte("3")}, &fakeMsg{id: "d", data: []byte("4")}
	h.handle(ctx, []jetstream.Msg{again, c, d})
	if n := svc.count("a"); n != 1 {
		t.Fatalf("the duplicate of a was POSTed again: %d calls", n)
	}
	if again.acks.Load() != 1 {
		t.Fatalf("the duplicate of a: %d acks, want 1", again.acks.Load())
	}
	if svc.count("c") != 0 || c.acks.Load() != 0 || c.delayed.Load() != 1 {
		t.Fatalf("held c: %d calls, %d acks, %d delayed naks; want 0 0 1", svc.count("c"), c.acks.Load(), c.delayed.Load())
	}
	if svc.count("d") != 1 || d.acks.Load() != 1 {
		t.Fatalf("new d: %d calls, %d acks; want 1 1", svc.count("d"), d.acks.Load())
	}
	if trips, calls := h.trips.Load(), h.msgs.Load(); trips != 4 || calls != 2+2+3+1 {
		t.Fatalf("store round trips %d, calls %d; want 4, 8", trips, calls)
	}
}

// TestHandStoreFencing, on each store: an outcome recorded with a token that no longer owns
// the record changes nothing; a record whose lease ran out after its
// claim recorded the call's start is failed (outcome unknown), not
// acquired again; a message ID with another payload is a conflict.
func TestHandStoreFencing(t *testing.T) {
	for _, ts := range handTestStores(t) {
		t.Run(ts.name, func(t *testing.T) { testHandFencing(t, ts) })
	}
}

func testHandFencing(t *testing.T, ts handTestStore) {
	st := ts.st
	ctx := t.Context()
	claim := func(id, payload string, lease time.Duration) handClaim {
		t.Helper()
		got, err := st.claim(ctx, []handMsg{{id, handFP(payload)}}, lease)
		if err != nil {
			t.Fatal(err)
		}
		c, ok := got[id]
		if !ok {
			t.Fatalf("%s: no verdict", id)
		}
		return c
	}
	finish := func(o handOutcome) bool {
		t.Helper()
		done, err := st.finish(ctx, []handOutcome{o})
		if err != nil {
			t.Fatal(err)
		}
		return done[o.id]
	}

	// Token 1 claims x with a lease that has run out at once, and
	// releases it (its call answered 503: no effect); token 2 takes it.
	if c := claim("x", "p", 0); !c.acquired || c.token != 1 {
		t.Fatalf("first claim: %+v, want token 1 acquired", c)
	}
	if !finish(handOutcome{"x", 1, handHeld}) {
		t.Fatal("the release of token 1 was refused")
	}
	if c := claim("x", "p", time.Hour); !c.acquired || c.token != 2 {
		t.Fatalf("claim after the release: %+v, want token 2 acquired", c)
	}
	if finish(handOutcome{"x", 1, handCompleted}) {
		t.Fatal("the stale token 1 completed x")
	}
	if s, tok := ts.state(t, "x"); s != handHeld || tok != 2 {
		t.Fatalf("after the stale completion: state %d token %d, want %d 2", s, tok, handHeld)
	}
	if !finish(handOutcome{"x", 2, handCompleted}) {
		t.Fatal("token 2's completion was refused")
	}
	if finish(handOutcome{"x", 2, handCompleted}) {
		t.Fatal("a completed record was completed again")
	}

	// y's claim recorded that its call started, then its lease ran out:
	// the next claim fails it instead of calling again.
	claim("y", "q", 0)
	if c := claim("y", "q", time.Hour); c.acquired || c.state != handFailed {
		t.Fatalf("takeover after a started call: %+v, want failed, not acquired", c)
	}
	if s, _ := ts.state(t, "y"); s != handFailed {
		t.Fatalf("y: state %d, want %d", s, handFailed)
	}

	// The same ID with another payload.
	if c := claim("x", "other", time.Hour); c.acquired || c.state != handConflict {
		t.Fatalf("another payload: %+v, want a conflict", c)
	}
}

package idemhttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemhttp"
)

// gatedAcquire holds each Acquire until gate closes, or fails it when its
// context ends first (as a store call cancelled by its context does).
type gatedAcquire struct {
	idemdriver.LeaseStore
	entered chan struct{}
	gate    chan struct{}
}

func (g *gatedAcquire) Acquire(ctx context.Context, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	select {
	case g.entered <- struct{}{}:
	default:
	}
	select {
	case <-g.gate:
	case <-ctx.Done():
		return idemdriver.AcquireResult{}, ctx.Err()
	}
	return g.LeaseStore.Acquire(ctx, p)
}

// TestClientHangUpDuringClaim: without Options.Wait, a client that hangs
// up while its key is being claimed does not turn the claim into a store
// error: the claim lands, the handler runs once, its 201 is stored, and
// the retry replays it.
func TestClientHangUpDuringClaim(t *testing.T) {
	t.Parallel()
	store := &gatedAcquire{LeaseStore: idem.NewMemoryStore(nil), entered: make(chan struct{}, 1), gate: make(chan struct{})}
	var runs atomic.Int64
	mw, err := idemhttp.New(store, idemhttp.Options{Namespace: "claim",
		Scope: func(*http.Request) (string, error) { return "user", nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	h := mw.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":1}`))
	}))
	post := func(ctx context.Context) *httptest.ResponseRecorder {
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/pay", strings.NewReader(`{"amount":100}`))
		req.Header.Set(idemhttp.HeaderIdempotencyKey, `"k1"`)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	ctx, hangUp := context.WithCancel(t.Context())
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- post(ctx) }()
	<-store.entered
	hangUp()
	close(store.gate)
	if rec := <-done; rec.Code != http.StatusCreated {
		t.Fatalf("the request whose client hung up during the claim: %d %s, want 201 (run and stored)", rec.Code, rec.Body)
	}
	rec := post(t.Context())
	if rec.Code != http.StatusCreated || rec.Header().Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("retry: %d (replayed %q), want the stored 201", rec.Code, rec.Header().Get(idemhttp.HeaderReplayed))
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
	if s := mw.Stats(); s.StoreErrors != 0 || s.Completed != 1 || s.Replayed != 1 {
		t.Errorf("stats %+v, want no store error, 1 completed, 1 replayed", s)
	}
}

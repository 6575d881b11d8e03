package idemhttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemhttp"
)

// deadlineStore records how far ahead the deadline of each final write
// (Complete, Release) was when the call began; an unbounded call is
// recorded as a negative duration.
type deadlineStore struct {
	idemdriver.LeaseStore
	mu    sync.Mutex
	ahead []time.Duration
}

func (s *deadlineStore) note(ctx context.Context) {
	d := time.Duration(-1)
	if dl, ok := ctx.Deadline(); ok {
		d = time.Until(dl)
	}
	s.mu.Lock()
	s.ahead = append(s.ahead, d)
	s.mu.Unlock()
}

func (s *deadlineStore) Complete(ctx context.Context, p *idemdriver.CompleteParams) error {
	s.note(ctx)
	return s.LeaseStore.Complete(ctx, p)
}

func (s *deadlineStore) Release(ctx context.Context, p *idemdriver.ReleaseParams) error {
	s.note(ctx)
	return s.LeaseStore.Release(ctx, p)
}

// TestFinalWritesBoundedByStoreTimeout: the middleware's final writes
// (the completion of a stored response, the release of a 500) are each
// bounded by Options.StoreTimeout, so a store that hangs cannot hold a
// request without end. The bound comes from the lease engine's store
// calls; the middleware adds none of its own.
func TestFinalWritesBoundedByStoreTimeout(t *testing.T) {
	t.Parallel()
	const timeout = 7 * time.Second
	st := &deadlineStore{LeaseStore: idem.NewMemoryStore(nil)}
	mw, err := idemhttp.New(st, idemhttp.Options{Namespace: "bound", StoreTimeout: timeout,
		Scope: func(*http.Request) (string, error) { return "user", nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	h := mw.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/fail" {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	for i, path := range []string{"/ok", "/fail"} {
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(`{}`))
		req.Header.Set(idemhttp.HeaderIdempotencyKey, `"k`+path[1:]+`"`)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if want := []int{http.StatusCreated, http.StatusInternalServerError}[i]; rec.Code != want {
			t.Fatalf("%s: status %d, want %d", path, rec.Code, want)
		}
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.ahead) != 2 {
		t.Fatalf("%d final writes, want 2 (a completion and a release)", len(st.ahead))
	}
	for i, d := range st.ahead {
		if d <= 0 || d > timeout {
			t.Fatalf("final write %d: deadline %v ahead (negative: none), want within (0, %v]", i, d, timeout)
		}
	}
}

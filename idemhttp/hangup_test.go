package idemhttp_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// TestClientHangUpDoesNotCancelHandler: a handler that gives up when its
// context ends (the usual Go pattern) must not be cut short by a client
// that hangs up: the request runs to its end, its 201 is stored, and the
// retry replays it. The handler's context used to be the client's: it
// returned without writing, and the middleware stored (and replayed) an
// empty 200 for a payment that was never made.
func TestClientHangUpDoesNotCancelHandler(t *testing.T) {
	t.Parallel()
	started, gate := make(chan struct{}), make(chan struct{})
	var payments atomic.Int64
	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		select {
		case <-r.Context().Done():
			return // gave up: no payment, no response
		case <-gate:
		}
		payments.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"payment":1}`))
	})
	mw, err := idemhttp.New(idem.NewMemoryStore(nil), idemhttp.Options{Namespace: "pay",
		Scope: func(*http.Request) (string, error) { return "user", nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	// noticed closes when the server has seen the client hang up: the
	// request's own context (outside the middleware) ended.
	noticed := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		go func() {
			<-r.Context().Done()
			if errors.Is(r.Context().Err(), context.Canceled) {
				select {
				case <-noticed:
				default:
					close(noticed)
				}
			}
		}()
		mw.Require(pay).ServeHTTP(w, r)
	}))
	defer srv.Close()

	post := func(ctx context.Context) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/pay", strings.NewReader(`{"amount":100}`))
		req.Header.Set(idemhttp.HeaderIdempotencyKey, `"k1"`)
		return http.DefaultClient.Do(req)
	}
	ctx, hangUp := context.WithCancel(t.Context())
	first := make(chan error, 1)
	go func() {
		resp, err := post(ctx)
		if err == nil {
			resp.Body.Close()
		}
		first <- err
	}()
	<-started
	hangUp()
	if err := <-first; err == nil {
		t.Fatal("the first request got an answer after its client hung up")
	}
	select {
	case <-noticed:
	case <-time.After(30 * time.Second):
		t.Fatal("the server never saw the client hang up")
	}
	close(gate)
	for {
		resp, err := post(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusConflict { // still running
			continue
		}
		if resp.StatusCode != http.StatusCreated || resp.Header.Get(idemhttp.HeaderReplayed) != "true" {
			t.Fatalf("retry after the hang-up: %d (replayed %q), want the stored 201", resp.StatusCode, resp.Header.Get(idemhttp.HeaderReplayed))
		}
		break
	}
	if n := payments.Load(); n != 1 {
		t.Errorf("%d payments, want 1", n)
	}
}

package idemhttp_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemtest"
)

// TestMiddlewareCoalesce: Options.Coalesce reaches the lease engine: out
// of range it is refused (ErrInvalidOptions and idem.ErrInvalidConfig);
// with 64, concurrent new keys are each handled once and replayed.
func TestMiddlewareCoalesce(t *testing.T) {
	if _, err := idemhttp.New(idem.NewMemoryStore(nil), idemhttp.Options{Namespace: "pay", Coalesce: -1,
		Scope: func(*http.Request) (string, error) { return "user", nil }}); !errors.Is(err, idemhttp.ErrInvalidOptions) || !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("Coalesce -1: %v; want ErrInvalidOptions and idem.ErrInvalidConfig", err)
	}
	bc := idemtest.CountBatches(idem.NewMemoryStore(nil), false)
	mw, err := idemhttp.New(bc, idemhttp.Options{Namespace: "pay", Coalesce: 64, PurgeInterval: -1,
		Scope: func(*http.Request) (string, error) { return "user", nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	var runs atomic.Int64
	gate := make(chan struct{})
	srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		<-gate // every request in flight at once
		fmt.Fprint(w, "ok ", r.Header.Get(idemhttp.HeaderIdempotencyKey))
	})))
	defer srv.Close()
	const n = 16
	send := func(key string) (string, error) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
		req.Header.Set(idemhttp.HeaderIdempotencyKey, key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		var b strings.Builder
		_, _ = fmt.Fprint(&b, resp.StatusCode, " ")
		buf := make([]byte, 64)
		k, _ := resp.Body.Read(buf)
		b.Write(buf[:k])
		return b.String(), nil
	}
	var wg sync.WaitGroup
	bodies := make([]string, n)
	for i := range n {
		wg.Go(func() {
			var err error
			if bodies[i], err = send(fmt.Sprint("k", i)); err != nil {
				t.Error(err)
			}
		})
	}
	for runs.Load() < n {
		runtime.Gosched() // until every request's handler runs: its key acquired
	}
	close(gate)
	wg.Wait()
	for i := range n {
		again, err := send(fmt.Sprint("k", i))
		if want := fmt.Sprint("200 ok k", i); err != nil || bodies[i] != want || again != want {
			t.Errorf("key k%d: %q, replay %q, %v; want %q twice", i, bodies[i], again, err, want)
		}
	}
	if runs.Load() != n {
		t.Errorf("handler ran %d times; want %d", runs.Load(), n)
	}
	// How many went in batches depends on the timing (the memory store
	// answers in microseconds): logged, not asserted.
	a, c := bc.Batches()
	t.Logf("calls %+v, AcquireBatch %d, CompleteBatch %d", bc.Calls(), a, c)
}

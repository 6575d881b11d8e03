package idemhttp_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// outcomePrinter is a hook that prints each request's outcome (a core
// hook, idem.HookOutcome) and its HTTP answer (idemhttp.HookResponse).
// Package idemotel's Observer, given the same way, turns the core's events
// into metrics and spans.
type outcomePrinter struct{}

func (outcomePrinter) OnOutcome(_ context.Context, e idem.OutcomeEvent) {
	fmt.Printf("%s: %v %q, handler ran: %v\n", e.Consumer, e.Outcome.Status, e.Reason, e.Claimed)
}

func (outcomePrinter) OnResponse(_ context.Context, e idemhttp.ResponseEvent) {
	fmt.Printf("  HTTP %d %s replayed: %v\n", e.Status, strings.TrimPrefix(e.Problem, idemhttp.ProblemTypeBase), e.Replayed)
}

// Options.Hooks takes the core's hooks: each request with a key is one
// delivery of the consumer "idemhttp:"+Namespace; and idemhttp's own
// HookResponse, which reports the HTTP status.
func ExampleOptions_hooks() {
	mw, err := idemhttp.New(idem.NewMemoryStore(nil), idemhttp.Options{
		Namespace: "payments",
		Scope:     func(r *http.Request) (string, error) { return r.Header.Get("Authorization"), nil },
		Hooks:     []idem.Hook{outcomePrinter{}},
	})
	if err != nil {
		panic(err)
	}
	defer mw.Close()
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	for _, body := range []string{`{"cents":100}`, `{"cents":100}`, `{"cents":999}`} {
		req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer alice")
		req.Header.Set(idemhttp.HeaderIdempotencyKey, `"charge-1"`)
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	// Output:
	// idemhttp:payments: Processed "", handler ran: true
	//   HTTP 201  replayed: false
	// idemhttp:payments: Duplicate "completed", handler ran: false
	//   HTTP 201  replayed: true
	// idemhttp:payments: FingerprintMismatch "fingerprint_mismatch", handler ran: false
	//   HTTP 422 idempotency-key-reused replayed: false
}

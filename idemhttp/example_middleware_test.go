package idemhttp_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// A payment endpoint behind the middleware, on the memory store: the
// retry of a POST with the same Idempotency-Key replays the first
// response instead of charging twice, and user B's identical key is
// another key.
func Example() {
	var charges atomic.Int64
	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := charges.Add(1)
		info, _ := idemhttp.FromContext(r.Context())
		// A key for the payment provider, the same on every attempt.
		_ = info.DeriveKey("charge")
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/payments/%d", n))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"payment":%d}`, n)
	})

	mw, err := idemhttp.New(idem.NewMemoryStore(nil), idemhttp.Options{
		Namespace: "payments",
		// The principal: here the bearer token; in a real service the
		// authenticated account ID.
		Scope: func(r *http.Request) (string, error) {
			return strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "), nil
		},
	})
	if err != nil {
		panic(err)
	}
	defer mw.Close()
	srv := httptest.NewServer(mw.Require(pay))
	defer srv.Close()

	post := func(user, key string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":100}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+user)
		if key != "" {
			req.Header.Set(idemhttp.HeaderIdempotencyKey, `"`+key+`"`)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		if p, err := idemhttp.ReadProblem(resp); err == nil {
			fmt.Println(resp.StatusCode, p.Type[len(idemhttp.ProblemTypeBase):])
			return
		}
		body, _ := io.ReadAll(resp.Body)
		replayed := resp.Header.Get(idemhttp.HeaderReplayed) == "true"
		fmt.Println(resp.StatusCode, string(body), "replayed:", replayed)
	}
	post("alice", "order-42")
	post("alice", "order-42") // a retry: replayed
	post("bob", "order-42")   // another principal: its own key
	post("alice", "")         // the route requires a key
	fmt.Println("charges:", charges.Load())
	// Output:
	// 201 {"payment":1} replayed: false
	// 201 {"payment":1} replayed: true
	// 201 {"payment":2} replayed: false
	// 400 idempotency-key-missing
	// charges: 2
}

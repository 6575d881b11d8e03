package idemhttp_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// A service that knows nothing about idempotency keys, behind the proxy:
// the retry is answered from the store and never reaches the service.
func ExampleNewProxy() {
	var charges atomic.Int64
	service := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := charges.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charge":%d}`, n)
	}))
	defer service.Close()

	upstream, _ := url.Parse(service.URL)
	proxy, err := idemhttp.NewProxy(upstream, idem.NewMemoryStore(nil), nil)
	if err != nil {
		panic(err)
	}
	defer proxy.Close()
	front := httptest.NewServer(proxy)
	defer front.Close()

	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, front.URL+"/charges", strings.NewReader(`{"amount":1000}`))
		req.Header.Set("Authorization", "Bearer sk_alice")
		req.Header.Set("Idempotency-Key", `"order-42"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, string(body), "replayed:", resp.Header.Get("Idempotent-Replayed") == "true")
	}
	fmt.Println("charges made:", charges.Load())
	// Output:
	// 201 {"charge":1} replayed: false
	// 201 {"charge":1} replayed: true
	// charges made: 1
}

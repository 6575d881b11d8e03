package idemhttp_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/idem-go/idem/idemhttp"
)

// The client retries a failed POST with the same Idempotency-Key, so the
// server can tell the retry from a new operation.
func ExampleNewClient() {
	var (
		mu   sync.Mutex
		keys []string
	)
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		attempt := len(keys)
		mu.Unlock()
		if attempt == 1 {
			w.WriteHeader(http.StatusServiceUnavailable) // retried
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"charge":1}`)
	}))
	defer server.Close()

	client, err := idemhttp.NewClient(&idemhttp.TransportOptions{
		InitialInterval: 10 * time.Millisecond, // waits drawn from [0, 10ms], [0, 20ms], ...
		MaxAttempts:     3,
	})
	if err != nil {
		panic(err)
	}
	resp, err := client.Post(server.URL+"/charges", "application/json", strings.NewReader(`{"amount":1000}`))
	if err != nil {
		panic(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(resp.StatusCode, string(body))
	mu.Lock()
	defer mu.Unlock()
	fmt.Println("attempts:", len(keys), "same key:", keys[0] == keys[1])
	// Output:
	// 201 {"charge":1}
	// attempts: 2 same key: true
}

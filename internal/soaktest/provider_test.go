package soaktest

import (
	"maps"
	"net/http"
	"strconv"
	"sync"
)

// provider is the redis-lease pipeline's external service: a charge
// deduplicated by idempotency key (one effect per key, whatever the calls),
// every call counted, the highest fencing token seen per key kept, and the
// consumer's completion reports recorded with their tokens.
type provider struct {
	mu        sync.Mutex
	calls     map[string]int     // by idempotency key
	maxToken  map[string]int64   // by idempotency key
	completed map[string][]int64 // by message ID: the tokens reported
}

func newProvider() *provider {
	return &provider{calls: map[string]int{}, maxToken: map[string]int64{}, completed: map[string][]int64{}}
}

func (p *provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	token, err := strconv.ParseInt(q.Get("token"), 10, 64)
	if err != nil {
		http.Error(w, "bad token", http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch r.URL.Path {
	case "/charge":
		key := q.Get("key")
		p.calls[key]++
		p.maxToken[key] = max(p.maxToken[key], token)
		_, _ = w.Write([]byte("charged " + key))
	case "/completed":
		id := q.Get("id")
		p.completed[id] = append(p.completed[id], token)
	default:
		http.NotFound(w, r)
	}
}

// effects is the charges key has: 1 once called, whatever the calls.
func (p *provider) effects(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return min(p.calls[key], 1)
}

// snapshot copies the calls per key, the completion reports per message
// and the highest token per key.
func (p *provider) snapshot() (calls map[string]int, completed map[string][]int64, maxToken map[string]int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.calls), maps.Clone(p.completed), maps.Clone(p.maxToken)
}

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
	switch r.URL.Path {
	case "/charge":
		_, _ = w.Write(p.charge(q.Get("key"), token))
	case "/completed":
		p.complete(q.Get("id"), token)
	default:
		http.NotFound(w, r)
	}
}

// charge counts a call under key by the holder of token.
func (p *provider) charge(key string, token int64) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls[key]++
	p.maxToken[key] = max(p.maxToken[key], token)
	return []byte("charged " + key)
}

// seen records that the holder of token started on key, without a call.
func (p *provider) seen(key string, token int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.maxToken[key] = max(p.maxToken[key], token)
}

// complete records a completion report of message id by token.
func (p *provider) complete(id string, token int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.completed[id] = append(p.completed[id], token)
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

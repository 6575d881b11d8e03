package scenariotest

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemhttp"
)

func TestHMACHeaderScope(t *testing.T) {
	t.Parallel()
	req := httptest.NewRequest(http.MethodPost, "/", nil)
	req.Header.Set("Authorization", "Basic YWxpY2U6aHVudGVyMg==")
	scope := func(f func(*http.Request) (string, error)) string {
		s, err := f(req)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a1 := scope(idemhttp.HMACHeaderScope("Authorization", []byte("secret-one-0123456789")))
	a2 := scope(idemhttp.HMACHeaderScope("Authorization", []byte("secret-one-0123456789")))
	b := scope(idemhttp.HMACHeaderScope("Authorization", []byte("secret-two-0123456789")))
	plain := scope(idemhttp.HeaderScope("Authorization"))
	if a1 != a2 || a1 == b || a1 == plain || len(a1) != 64 {
		t.Fatalf("scopes: secret one %q and %q, secret two %q, unkeyed %q: want one stable 64-hex scope per secret", a1, a2, b, plain)
	}
	if sum := sha256.Sum256([]byte("Basic YWxpY2U6aHVudGVyMg==")); plain != hex.EncodeToString(sum[:]) {
		t.Fatalf("unkeyed scope %q changed: existing records would stop matching", plain)
	}
	none := httptest.NewRequest(http.MethodPost, "/", nil)
	if s, err := idemhttp.HMACHeaderScope("Authorization", []byte("secret-one-0123456789"))(none); s != "" || err != nil {
		t.Fatalf("no header: %q %v, want no scope", s, err)
	}
}

// recordingStore records everything the middleware asks a store to keep.
type recordingStore struct {
	*idem.MemoryStore
	mu   sync.Mutex
	seen []string
}

func (s *recordingStore) record(v any, extra ...[]byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seen = append(s.seen, fmt.Sprintf("%+v", v))
	for _, b := range extra {
		s.seen = append(s.seen, string(b))
	}
}

func (s *recordingStore) Acquire(ctx context.Context, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	s.record(*p, p.Fingerprint)
	return s.MemoryStore.Acquire(ctx, p)
}

func (s *recordingStore) Complete(ctx context.Context, p *idemdriver.CompleteParams) error {
	s.record(*p, p.Result)
	return s.MemoryStore.Complete(ctx, p)
}

func (s *recordingStore) Release(ctx context.Context, p *idemdriver.ReleaseParams) error {
	s.record(*p)
	return s.MemoryStore.Release(ctx, p)
}

func (s *recordingStore) SaveStep(ctx context.Context, p *idemdriver.StepParams) error {
	s.record(*p, p.Result)
	return s.MemoryStore.SaveStep(ctx, p)
}

func (s *recordingStore) all() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.seen, "\n")
}

// TestProxyScopeSecret: with a scope secret the same credentials and key
// under another secret are another scope (a retry after a change of secret
// is forwarded again: the migration note), and neither the secret nor the
// credentials (nor their unkeyed hash) reach the store. Without a secret,
// NewProxy warns once.
func TestProxyScopeSecret(t *testing.T) {
	t.Parallel()
	const secret1, secret2 = "first-secret-0123456789", "second-secret-0123456789"
	const auth = "Basic YWxpY2U6aHVudGVyMg==" // alice:hunter2
	up := newUpstream(t)
	st := &recordingStore{MemoryStore: idem.NewMemoryStore(nil)}
	env := testStoreEnv{store: st}
	front := func(secret string, logger *slog.Logger) *pxFront {
		return newProxies(t, env, up.URL, 1, &idemhttp.ProxyOptions{ScopeSecret: []byte(secret),
			Options: idemhttp.Options{Namespace: "px-scope-secret", Logger: logger}})[0]
	}
	post := func(f *pxFront) pxResp {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, f.srv.URL+"/payments", strings.NewReader(`{"amount":1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", auth)
		req.Header.Set(idemhttp.HeaderIdempotencyKey, `"pay-1"`)
		resp, err := f.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return pxResp{status: resp.StatusCode, header: resp.Header}
	}
	var logs lockedBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	a := front(secret1, logger)
	wantStatus(t, post(a), 201, false)
	wantStatus(t, post(a), 201, true)
	if up.n.Load() != 1 {
		t.Fatalf("upstream ran %d times under one secret, want 1", up.n.Load())
	}
	b := front(secret2, logger)
	wantStatus(t, post(b), 201, false)
	if up.n.Load() != 2 {
		t.Fatalf("upstream ran %d times: the same credentials and key under another secret must be another scope", up.n.Load())
	}
	if strings.Contains(logs.String(), "not keyed") {
		t.Fatalf("a proxy with a secret warned: %s", logs.String())
	}

	stored := st.all()
	plain := sha256.Sum256([]byte(auth))
	for _, leak := range []string{secret1, secret2, auth, "YWxpY2U6aHVudGVyMg", "hunter2", hex.EncodeToString(plain[:]),
		base64.RawURLEncoding.EncodeToString([]byte(secret1))} {
		if strings.Contains(stored, leak) {
			t.Errorf("the store was given %q", leak)
		}
	}
	if !strings.Contains(stored, "pay-1") {
		t.Fatalf("the recording store saw no record: %s", stored)
	}

	var warn lockedBuffer
	c := front("", slog.New(slog.NewTextHandler(&warn, nil)))
	wantStatus(t, post(c), 201, false)
	wantStatus(t, post(c), 201, true)
	if n := strings.Count(warn.String(), "scope is not keyed"); n != 1 {
		t.Fatalf("a proxy without a secret warned %d times, want once: %s", n, warn.String())
	}
}

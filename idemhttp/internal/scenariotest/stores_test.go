package scenariotest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemhttp"
)

// Environment variables naming the test servers (TESTING.md).
const (
	envPostgres   = "IDEM_TEST_POSTGRES_URL"
	envMySQL      = "IDEM_TEST_MYSQL_URL"
	envRedis      = "IDEM_TEST_REDIS_URL"
	envRequireAll = "IDEM_TEST_REQUIRE_ALL"
)

// testServerURL returns the URL in env, skipping the test when it is unset,
// or failing it under IDEM_TEST_REQUIRE_ALL=1.
func testServerURL(t testing.TB, env string) string {
	t.Helper()
	u := os.Getenv(env)
	if u == "" {
		msg := fmt.Sprintf("missing environment variable %s: set it to run against that server (scripts/services prints it)", env)
		if os.Getenv(envRequireAll) == "1" {
			t.Fatalf("%s; %s=1 requires every server", msg, envRequireAll)
		}
		t.Skip(msg)
	}
	return u
}

func testRandName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// testStoreEnv is one store under test: store, and second, another handle
// on the same records (a second process: its own connection pool or
// client).
type testStoreEnv struct {
	store, second idemdriver.LeaseStore
	// handProxy, when set (Redis), returns BenchmarkProxy's hand-written
	// idempotent proxy to upstream on the same server (handProxy in
	// proxy_hand_bench_test.go).
	handProxy func(upstream *url.URL) http.Handler
	// serverCPU, when set (Redis), returns the store server's CPU time so
	// far (INFO cpu), for BenchmarkProxy's server-cpu-µs/req.
	serverCPU func() time.Duration
}

// testStore opens a store kind. Each call gives fresh tables (or a fresh
// Redis prefix), dropped at cleanup; tests isolate further by namespace.
type testStore struct {
	name string
	open func(t testing.TB) testStoreEnv
	// perTest says open is cheap and private (an in-process store): the
	// scenario runner opens one per scenario instead of sharing one,
	// so that SQLite's single writer is not shared by every scenario.
	perTest bool
}

// testStores is every store the middleware runs on.
var testStores = []testStore{
	{"memory", func(t testing.TB) testStoreEnv {
		s := idem.NewMemoryStore(nil)
		return testStoreEnv{store: s, second: s}
	}, true},
}

// errInjected is the failure a faultStore injects.
var errInjected = errors.New("injected store failure")

// faultStore wraps a real store and fails chosen calls, as an outage or
// a dead process would.
type faultStore struct {
	idemdriver.LeaseStore
	down         atomic.Bool // every call fails
	dead         atomic.Bool // Renew, Complete and Release fail (the process died)
	failComplete atomic.Int32
}

func (f *faultStore) Acquire(ctx context.Context, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	if f.down.Load() {
		return idemdriver.AcquireResult{}, errInjected
	}
	return f.LeaseStore.Acquire(ctx, p)
}

func (f *faultStore) Renew(ctx context.Context, p *idemdriver.RenewParams) error {
	if f.down.Load() || f.dead.Load() {
		return errInjected
	}
	return f.LeaseStore.Renew(ctx, p)
}

func (f *faultStore) Complete(ctx context.Context, p *idemdriver.CompleteParams) error {
	if f.down.Load() || f.dead.Load() {
		return errInjected
	}
	if f.failComplete.Load() > 0 {
		f.failComplete.Add(-1)
		return errInjected
	}
	return f.LeaseStore.Complete(ctx, p)
}

func (f *faultStore) Release(ctx context.Context, p *idemdriver.ReleaseParams) error {
	if f.down.Load() || f.dead.Load() {
		return errInjected
	}
	return f.LeaseStore.Release(ctx, p)
}

// recordContentType returns the content type idemhttp tags its records
// with, read back from a record that one real request completed on a
// memory store (tests that plant records use it, so that a planted record
// is taken for one of idemhttp's).
func recordContentType(t testing.TB) string {
	t.Helper()
	store := idem.NewMemoryStore(nil)
	m, err := idemhttp.New(store, idemhttp.Options{
		Namespace:     "probe",
		Scope:         func(*http.Request) (string, error) { return "probe", nil },
		PurgeInterval: -1,
		Logger:        scQuietLogger(),
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer m.Close()
	req := httptest.NewRequest(http.MethodPost, "/probe", strings.NewReader(`{}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idemhttp.HeaderIdempotencyKey, `"probe"`)
	w := httptest.NewRecorder()
	m.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })).ServeHTTP(w, req)
	if w.Code != http.StatusCreated {
		t.Fatalf("probe request: %d %s", w.Code, w.Body)
	}
	ar, err := store.Acquire(t.Context(), &idemdriver.AcquireParams{Consumer: m.Consumer(), MessageID: m.RecordID("probe", "probe"), Fingerprint: []byte("peek"), Lease: time.Second})
	if err != nil || ar.Acquired || ar.ContentType == "" {
		t.Fatalf("probe record: acquired %v, content type %q, err %v", ar.Acquired, ar.ContentType, err)
	}
	return ar.ContentType
}

package interop

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/faultproxy"
	"github.com/idem-go/idem/internal/testenv"
)

// TestStoreCutAtFinalWrite cuts the proxy's store connections the moment
// the upstream answers, so the final write (Complete) reaches the store
// and its reply is lost, for a window shorter than the lease (the
// proxy's retried final write must succeed) and longer than it (the
// lease is lost). In both the upstream runs each key once and no retry
// is forwarded again.
func TestStoreCutAtFinalWrite(t *testing.T) {
	stores := []struct{ name, env, example string }{
		{"postgres", testenv.PostgresEnv, "postgres://idem:idem@127.0.0.1:5432/idem_test?sslmode=disable"},
		{"redis", testenv.RedisEnv, "redis://127.0.0.1:6379/0"},
	}
	windows := []struct {
		name      string
		window    time.Duration
		wantFirst int   // the first attempt's status
		wantRetry []int // its retries' (any of)
	}{
		// The final write is retried while the lease is held and lands.
		{"short", 400 * time.Millisecond, http.StatusCreated, []int{http.StatusCreated}},
		// The lease ends first: 503 now; after, the stored outcome-unknown,
		// or the replayed response where the final write landed although
		// its reply was lost (a store that completes in one round trip,
		// such as Redis's one script).
		{"beyond-lease", 4 * time.Second, http.StatusServiceUnavailable, []int{http.StatusBadGateway, http.StatusCreated}},
	}
	for _, st := range stores {
		for _, w := range windows {
			t.Run(st.name+"/"+w.name, func(t *testing.T) {
				f, storeURL := faultproxy.URL(t, testenv.URL(t, st.env, st.example))
				up := newUpstream(t)
				up.beforeAnswer = func(string) { f.CutAnswers(w.window) }
				args := []string{"--upstream", up.URL, "--store", storeURL, "--lease", "1500ms"}
				if st.name == "postgres" {
					args = append(args, "--table", "idem_interop_"+uniq())
				} else {
					args = append(args, "--redis-prefix", "idem:interop:"+uniq()+":")
				}
				p := startProxy(t, args...)

				key, body := "cut-"+uniq(), `{"amount":7}`
				c := &http.Client{Timeout: 30 * time.Second}
				first := post(context.Background(), c, p.URL, key, body)
				t.Logf("%s window %v: first attempt got %v; store connections cut: %d", st.name, w.window, first, f.Cuts())
				if f.Cuts() == 0 {
					t.Fatal("no store connection was cut")
				}
				for time.Now().Before(f.CutUntil()) {
					time.Sleep(50 * time.Millisecond)
				}
				retry := postUntilFinal(t, p.URL, key, body, 20*time.Second)
				again := post(context.Background(), c, p.URL, key, body)
				t.Logf("%s window %v: retry got %v; next retry %v", st.name, w.window, retry, again)
				if retry.status != again.status || string(retry.body) != string(again.body) {
					t.Errorf("two retries got different answers: %v, then %v", retry, again)
				}
				switch retry.status {
				case http.StatusCreated:
					if retry.header.Get("Idempotent-Replayed") != "true" {
						t.Errorf("retry got a 201 that is not a replay: %v", retry)
					}
				case http.StatusBadGateway:
				default:
					t.Errorf("retry got %v, want the replayed 201 or the stored 502", retry)
				}
				if first.err != nil || first.status != w.wantFirst || !slices.Contains(w.wantRetry, retry.status) {
					t.Errorf("first attempt %v, retry %v: want statuses %d then one of %v", first, retry, w.wantFirst, w.wantRetry)
				}
				reqs, execs := up.counts(key)
				t.Logf("%s window %v: upstream requests %d, executions %d", st.name, w.window, reqs, execs)
				if reqs != 1 || execs != 1 {
					t.Errorf("key reached the upstream %d times (%d executions), want once", reqs, execs)
				}
			})
		}
	}
}

package interop

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/internal/testenv"
)

// storeCase is a store of `idem proxy`: its --store URL and the flags
// that isolate this test's keys (a fresh table, a unique Redis prefix).
type storeCase struct {
	name string
	args func(t *testing.T) []string
}

func storeCases() []storeCase {
	return []storeCase{
		{"sqlite", func(t *testing.T) []string {
			return []string{"--store", "sqlite:" + filepath.Join(t.TempDir(), "proxy.db")}
		}},
		{"postgres", func(t *testing.T) []string {
			u := testenv.URL(t, testenv.PostgresEnv, "postgres://idem:idem@127.0.0.1:5432/idem_test?sslmode=disable")
			return []string{"--store", u, "--table", "idem_interop_" + uniq()}
		}},
		{"redis", func(t *testing.T) []string {
			u := testenv.URL(t, testenv.RedisEnv, "redis://127.0.0.1:6379/0")
			return []string{"--store", u, "--redis-prefix", "idem:interop:" + uniq() + ":"}
		}},
	}
}

// TestKillProxyMidRequest SIGKILLs `idem proxy` while the upstream is
// executing a key's request, restarts it on the same store and retries
// the key: the retry must get the stored 502 upstream-outcome-unknown
// (and so must the next one), never a second execution.
func TestKillProxyMidRequest(t *testing.T) {
	for _, sc := range storeCases() {
		t.Run(sc.name, func(t *testing.T) {
			store := sc.args(t)
			up := newUpstream(t)
			release := make(chan struct{})
			up.first = func(key string) (<-chan struct{}, int) {
				if strings.HasPrefix(key, "killed-") {
					return release, 0
				}
				return nil, 0
			}
			args := append([]string{"--upstream", up.URL, "--lease", "1s"}, store...)

			p1 := startProxy(t, args...)
			killed := "killed-" + uniq()
			body := `{"amount":100}`
			first := make(chan answer, 1)
			go func() { first <- post(context.Background(), http.DefaultClient, p1.URL, killed, body) }()
			up.waitArrived(t, killed)
			p1.Kill()
			if a := <-first; a.err == nil {
				t.Fatalf("first attempt answered %v through a killed proxy", a)
			}
			close(release) // the upstream finishes; nobody records its answer

			p2 := startProxy(t, args...)
			a := postUntilFinal(t, p2.URL, killed, body, 20*time.Second)
			if a.status != http.StatusBadGateway || a.problemType() != idemhttp.ProblemUpstreamOutcomeUnknown {
				t.Fatalf("retry after the kill: got %v, want 502 %s", a, idemhttp.ProblemUpstreamOutcomeUnknown)
			}
			if got := a.header.Get("Idempotency-Key"); got != killed {
				t.Errorf("retry answer echoes Idempotency-Key %q, want %q", got, killed)
			}
			again := post(context.Background(), http.DefaultClient, p2.URL, killed, body)
			if again.status != http.StatusBadGateway || again.problemType() != idemhttp.ProblemUpstreamOutcomeUnknown {
				t.Fatalf("second retry: got %v, want the same stored 502", again)
			}

			// A key sent to the restarted proxy runs once and replays.
			fresh := "fresh-" + uniq()
			if a := post(context.Background(), http.DefaultClient, p2.URL, fresh, body); a.status != http.StatusCreated {
				t.Fatalf("fresh key: got %v, want 201", a)
			}
			if a := post(context.Background(), http.DefaultClient, p2.URL, fresh, body); a.status != http.StatusCreated || a.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("fresh key retry: got %v, want a replayed 201", a)
			}

			for _, k := range []string{killed, fresh} {
				reqs, execs := up.counts(k)
				t.Logf("%s: key %s: upstream requests %d, executions %d", sc.name, k, reqs, execs)
				if reqs != 1 || execs != 1 {
					t.Errorf("%s: key %s reached the upstream %d times (%d executions), want exactly once", sc.name, k, reqs, execs)
				}
			}
		})
	}
}

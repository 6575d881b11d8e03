package failovertest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/store/idemredis"
)

// TestProxySentinelFailover puts idemhttp's Proxy (what `idem proxy`
// serves) on idemredis through go-redis's Sentinel-aware client on
// redis-ha, in front of an upstream that counts the POSTs it executes per
// Idempotency-Key. Clients send every key twice, the second copy later, as
// a client retrying after a lost answer does, each until it gets a final
// answer: a retry follows every 409, 503 and 502 upstream-unavailable (50
// ms later). Mid-load the master is SIGKILLed and the Sentinel promotes
// the replica. Counted per failover: keys the upstream executed twice,
// keys answered 2xx that the upstream never executed (lost), keys whose
// final answer was "outcome unknown" (the proxy's stored answer when the
// record of a forwarded request was lost mid-flight), and the time to
// recover. Asserted: nothing lost (the proxy answers 2xx only with the
// upstream's own response). The keys executed twice are recorded, not
// asserted, with the servers' logs when there are some: one failover with
// WaitReplicas 1 executed 71 keys twice (docs/failover.md).
func TestProxySentinelFailover(t *testing.T) {
	t.Parallel()
	c, client, failover := startSentinel(t)
	forWaitConfigs(t, client, "", func(t *testing.T, store *idemredis.Store, _, _ string, waits bool) {
		forProxyLeases(t, func(t *testing.T, lease time.Duration) {
			testProxyFailover(t, store, waits, lease, failover, func() string {
				return logTails(c.Dir, "redis-ha/sentinel/sentinel.log", "redis-ha/node1/redis.log", "redis-ha/node2/redis.log")
			})
		})
	})
}

// TestProxyClusterFailover is TestProxySentinelFailover on redis-cluster
// through a ClusterClient: the keys spread over the three masters, and the
// master serving slot 0 is SIGKILLed each round, so about a third of the
// keys are on the master that dies.
func TestProxyClusterFailover(t *testing.T) {
	t.Parallel()
	c, cc := startRedisCluster(t)
	forWaitConfigs(t, cc, "", func(t *testing.T, store *idemredis.Store, _, _ string, waits bool) {
		forProxyLeases(t, func(t *testing.T, lease time.Duration) {
			v := &clusterVictim{t: t, c: c, cc: cc}
			testProxyFailover(t, store, waits, lease, func(killed func()) (func() error, error) {
				v.pick()
				return v.failover(killed)
			}, nil)
		})
	})
}

// forProxyLeases runs run as a subtest for each proxy lease measured: the
// default (idemhttp.DefaultLease, 30 s), longer than a failover, and, with
// IDEM_FAILOVER_FULL=1 only (to keep scripts/test short), 2 s, shorter.
func forProxyLeases(t *testing.T, run func(t *testing.T, lease time.Duration)) {
	leases := []time.Duration{idemhttp.DefaultLease}
	if os.Getenv("IDEM_FAILOVER_FULL") == "1" {
		leases = append(leases, 2*time.Second)
	}
	for _, lease := range leases {
		t.Run("lease_"+lease.String(), func(t *testing.T) { run(t, lease) })
	}
}

// proxyCounts is what the upstream and the clients of one configuration
// saw.
type proxyCounts struct {
	mu       sync.Mutex
	executed map[string]int  // POSTs the upstream executed, by key
	ok       map[string]bool // keys answered 2xx
	unknown  map[string]bool // keys answered "outcome unknown" (final)
	lastFail atomic.Int64    // the last 503 or failed connection, ns since the Unix epoch
}

// testProxyFailover runs the rounds of one configuration: a Proxy on
// store with lease, each round with failover; after a round with keys
// executed twice it logs diag (nil: nothing).
func testProxyFailover(t *testing.T, store *idemredis.Store, waits bool, lease time.Duration,
	failover func(killed func()) (func() error, error), diag func() string) {
	ctx := t.Context()
	pc := &proxyCounts{executed: map[string]int{}, ok: map[string]bool{}, unknown: map[string]bool{}}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		pc.mu.Lock()
		pc.executed[key]++
		pc.mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"key":%s}`, key)
	}))
	defer upstream.Close()
	u, err := url.Parse(upstream.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := idemhttp.NewProxy(u, store, &idemhttp.ProxyOptions{Options: idemhttp.Options{
		Lease: lease, StoreTimeout: 2 * time.Second, PurgeInterval: -1,
		Logger: slog.New(slog.DiscardHandler),
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	front := httptest.NewServer(proxy)
	defer front.Close()
	hc := &http.Client{Timeout: 10 * time.Second}
	process := func(ctx context.Context, id string) error {
		key := `"` + id + `"`
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, front.URL+"/charges", strings.NewReader(`{"amount":1}`))
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer failover")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := hc.Do(req)
		if err != nil {
			pc.lastFail.Store(time.Now().UnixNano())
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode/100 == 2 {
			_, _ = io.Copy(io.Discard, resp.Body)
			pc.mu.Lock()
			pc.ok[key] = true
			pc.mu.Unlock()
			return nil
		}
		p, err := idemhttp.ReadProblem(resp)
		if err == nil && (errors.Is(p, idemhttp.ErrOutcomeUnknown) || errors.Is(p, idemhttp.ErrUpstreamOutcomeUnknown)) {
			pc.mu.Lock()
			pc.unknown[key] = true
			pc.mu.Unlock()
			return nil // a final answer: a retry gets it again
		}
		if resp.StatusCode == http.StatusServiceUnavailable {
			pc.lastFail.Store(time.Now().UnixNano())
		}
		return fmt.Errorf("%d: %v", resp.StatusCode, err)
	}
	var m matrix
	var unknowns, unrun []int
	var outages []time.Duration
	n := messages(t)
	for r := range slowRounds(t) {
		all := ids(r, n)
		var killedAt atomic.Int64
		res := round{deliveries: twice(all, n/4), process: process, killAt: n / 3, failover: func(killed func()) (func() error, error) {
			return failover(func() {
				killedAt.Store(time.Now().UnixNano())
				killed()
			})
		}}.run(ctx, t)
		pc.mu.Lock()
		effects := map[string]int{}
		answered := roundResult{acked: map[string]bool{}, recover: res.recover}
		unknown, notRun := 0, 0
		for _, id := range all {
			key := `"` + id + `"`
			effects[id] = pc.executed[key]
			answered.acked[id] = pc.ok[key]
			if pc.unknown[key] {
				unknown++
				if pc.executed[key] == 0 {
					notRun++
				}
			}
		}
		pc.mu.Unlock()
		doubles, lost := m.add(answered, all, effects)
		unknowns, unrun = append(unknowns, unknown), append(unrun, notRun)
		outage := time.Duration(max(0, pc.lastFail.Load()-killedAt.Load()))
		outages = append(outages, outage)
		t.Logf("round %d: %d keys executed twice, %d answered 2xx without execution, %d answered outcome unknown (%d of them never executed), first 2xx after the kill %v, last 503 %v after it",
			r, doubles, lost, unknown, notRun, res.recover, outage)
		if lost != 0 {
			t.Errorf("round %d: %d keys answered 2xx that the upstream never executed", r, lost)
		}
		if doubles != 0 && diag != nil {
			t.Logf("round %d: the servers' logs:\n%s", r, diag())
		}
	}
	t.Logf("%s: %v; outcome unknown %s (never executed %s); last 503 after the kill %s", t.Name(), &m, medianInts(unknowns), medianInts(unrun), medianDurations(outages))
}

// logTails returns the last 40 lines of each file (paths under dir).
func logTails(dir string, paths ...string) string {
	var b strings.Builder
	for _, p := range paths {
		data, err := os.ReadFile(filepath.Join(dir, p))
		lines := strings.Split(string(data), "\n")
		fmt.Fprintf(&b, "== %s (%v)\n%s\n", p, err, strings.Join(lines[max(0, len(lines)-40):], "\n"))
	}
	return b.String()
}

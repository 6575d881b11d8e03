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
			testProxyFailover(t, store, waits, lease, failover, &serverLogs{dir: c.Dir,
				paths: []string{"redis-ha/sentinel/sentinel.log", "redis-ha/node1/redis.log", "redis-ha/node2/redis.log"}})
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
	executed map[string]int      // POSTs the upstream executed, by key
	ok       map[string]bool     // keys answered 2xx
	unknown  map[string]bool     // keys answered "outcome unknown" (final)
	events   map[string][]string // with IDEM_FAILOVER_KEEP: what happened to each key, in order
	start    time.Time           // the configuration's start: event times are since it
	lastFail atomic.Int64        // the last 503 or failed connection, ns since the Unix epoch
}

// event records what happened to key (with IDEM_FAILOVER_KEEP only), with
// the time since the start; the caller holds mu.
func (pc *proxyCounts) event(key, format string, args ...any) {
	if pc.events != nil {
		pc.events[key] = append(pc.events[key], fmt.Sprintf("%.3fs ", time.Since(pc.start).Seconds())+fmt.Sprintf(format, args...))
	}
}

// keepDir is IDEM_FAILOVER_KEEP: a directory where the proxy rows keep,
// for each round, the servers' logs and every key's record (keys.tsv).
func keepDir() string { return os.Getenv("IDEM_FAILOVER_KEEP") }

// serverLogs names the log files of a configuration's servers: paths
// under dir.
type serverLogs struct {
	dir   string
	paths []string
}

// testProxyFailover runs the rounds of one configuration: a Proxy on
// store with lease, each round with failover; after a round with keys
// executed twice it logs the tails of logs (nil: none), and with
// IDEM_FAILOVER_KEEP it keeps every round's logs and keys (keepRound).
func testProxyFailover(t *testing.T, store *idemredis.Store, waits bool, lease time.Duration,
	failover func(killed func()) (func() error, error), logs *serverLogs) {
	ctx := t.Context()
	pc := &proxyCounts{executed: map[string]int{}, ok: map[string]bool{}, unknown: map[string]bool{}, start: time.Now()}
	if keepDir() != "" {
		pc.events = map[string][]string{}
	}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		pc.mu.Lock()
		pc.executed[key]++
		pc.event(key, "executed (%d)", pc.executed[key])
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
			pc.mu.Lock()
			pc.event(key, "no answer: %v", err)
			pc.mu.Unlock()
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode/100 == 2 {
			_, _ = io.Copy(io.Discard, resp.Body)
			pc.mu.Lock()
			pc.ok[key] = true
			pc.event(key, "answered %d (replayed %q)", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"))
			pc.mu.Unlock()
			return nil
		}
		p, err := idemhttp.ReadProblem(resp)
		pc.mu.Lock()
		pc.event(key, "answered %d: %v", resp.StatusCode, p)
		pc.mu.Unlock()
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
				pc.mu.Lock()
				pc.event("", "round %d: primary killed", r)
				pc.mu.Unlock()
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
		if doubles != 0 && logs != nil {
			t.Logf("round %d: the servers' logs:\n%s", r, logs.tails())
		}
		if keepDir() != "" {
			if err := keepRound(t, r, all, pc, logs); err != nil {
				t.Errorf("round %d: keeping its record: %v", r, err)
			}
		}
	}
	t.Logf("%s: %v; outcome unknown %s (never executed %s); last 503 after the kill %s", t.Name(), &m, medianInts(unknowns), medianInts(unrun), medianDurations(outages))
}

// keepRound writes round r's record under IDEM_FAILOVER_KEEP, in a
// directory named after the test and the round: keys.tsv (per key of all:
// executions, answered 2xx, answered outcome unknown, then its events),
// events of the round itself (the kill), and a copy of each of logs.
func keepRound(t *testing.T, r int, all []string, pc *proxyCounts, logs *serverLogs) error {
	dir := filepath.Join(keepDir(), strings.ReplaceAll(t.Name(), "/", "_"), fmt.Sprintf("round-%d", r))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var b strings.Builder
	pc.mu.Lock()
	b.WriteString("# " + strings.Join(pc.events[""], "\n# ") + "\n")
	for _, id := range all {
		key := `"` + id + `"`
		fmt.Fprintf(&b, "%s\t%d\t%v\t%v\t%s\n", id, pc.executed[key], pc.ok[key], pc.unknown[key], strings.Join(pc.events[key], " | "))
	}
	pc.mu.Unlock()
	if err := os.WriteFile(filepath.Join(dir, "keys.tsv"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	if logs == nil {
		return nil
	}
	for _, p := range logs.paths {
		data, err := os.ReadFile(filepath.Join(logs.dir, p))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, strings.ReplaceAll(p, "/", "_")), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// tails returns the last 40 lines of each log.
func (l *serverLogs) tails() string {
	var b strings.Builder
	for _, p := range l.paths {
		data, err := os.ReadFile(filepath.Join(l.dir, p))
		lines := strings.Split(string(data), "\n")
		fmt.Fprintf(&b, "== %s (%v)\n%s\n", p, err, strings.Join(lines[max(0, len(lines)-40):], "\n"))
	}
	return b.String()
}

package idemcli

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/ownservice"
)

// TestParseRedisStoreURL: each form of a Redis store URL opens the client
// of its kind with go-redis's reading of the rest, idem's wait_replicas
// and wait_timeout taken out; a bad URL is errBadURL and its message holds
// no password.
func TestParseRedisStoreURL(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		url               string
		kind              redisKind
		addrs             []string // the server, the Sentinels or the cluster's seeds
		db                int
		master, password  string
		wait              int
		waitTimeout, read time.Duration
		tls               bool
	}{
		{url: "redis://127.0.0.1:6379/2", kind: redisSingle, addrs: []string{"127.0.0.1:6379"}, db: 2},
		{url: "rediss://u:s3cret-pw@h:6380/0?wait_replicas=1", kind: redisSingle, addrs: []string{"h:6380"}, password: "s3cret-pw", wait: 1, tls: true},
		{url: "redis://h:1/0?wait_replicas=2&wait_timeout=250ms&read_timeout=3s", kind: redisSingle, addrs: []string{"h:1"}, wait: 2, waitTimeout: 250 * time.Millisecond, read: 3 * time.Second},
		{url: "redis-sentinel://127.0.0.1:26379/1?master_name=idem&addr=127.0.0.1:26380&password=m4ster-pw&wait_replicas=1&wait_timeout=2",
			kind: redisSentinel, addrs: []string{"127.0.0.1:26379", "127.0.0.1:26380"}, db: 1, master: "idem", password: "m4ster-pw", wait: 1, waitTimeout: 2 * time.Second},
		{url: "REDISS-SENTINEL://s:26379?master_name=m", kind: redisSentinel, addrs: []string{"s:26379"}, master: "m", tls: true},
		{url: "redis-cluster://u:cl-pw@127.0.0.1:7000?addr=127.0.0.1:7001&wait_replicas=1", kind: redisCluster, addrs: []string{"127.0.0.1:7000", "127.0.0.1:7001"}, password: "cl-pw", wait: 1},
		{url: "rediss-cluster://n:7000", kind: redisCluster, addrs: []string{"n:7000"}, tls: true},
	} {
		t.Run(tt.url, func(t *testing.T) {
			r, err := parseRedisStoreURL(tt.url)
			if err != nil {
				t.Fatal(err)
			}
			if r.kind != tt.kind || r.wait != tt.wait || r.waitTimeout != tt.waitTimeout {
				t.Fatalf("kind %d, wait %d, timeout %v; want %d, %d, %v", r.kind, r.wait, r.waitTimeout, tt.kind, tt.wait, tt.waitTimeout)
			}
			var addrs []string
			var db int
			var master, password string
			var read time.Duration
			var tls bool
			switch r.kind {
			case redisSingle:
				o := r.single
				addrs, db, password, read, tls = []string{o.Addr}, o.DB, o.Password, o.ReadTimeout, o.TLSConfig != nil
			case redisSentinel:
				o := r.failover
				addrs, db, master, password, read, tls = o.SentinelAddrs, o.DB, o.MasterName, o.Password, o.ReadTimeout, o.TLSConfig != nil
			case redisCluster:
				o := r.cluster
				addrs, password, read, tls = o.Addrs, o.Password, o.ReadTimeout, o.TLSConfig != nil
			}
			got := fmt.Sprint(addrs, db, master, password, read, tls)
			if want := fmt.Sprint(tt.addrs, tt.db, tt.master, tt.password, tt.read, tt.tls); got != want {
				t.Errorf("options %s, want %s", got, want)
			}
			c, where := r.client()
			defer c.Close()
			if strings.Contains(where, "pw") || !strings.Contains(where, tt.addrs[0]) {
				t.Errorf("where %q: want the address, no password", where)
			}
		})
	}
	for _, bad := range []string{
		"redis://:s3cret-pw@h:1/0?wait_replicas=x",
		"redis://:s3cret-pw@h:1/0?wait_replicas=-1",
		"redis://:s3cret-pw@h:1/0?wait_timeout=1s",
		"redis://:s3cret-pw@h:1/0?wait_replicas=1&wait_timeout=0",
		"redis://:s3cret-pw@h:1/0?wait_replicas=1&wait_timeout=soon",
		"redis://:s3cret-pw@h:1/0?no_such_option=1",
		"redis://:s3cret-pw@h:1/x",
		"redis-sentinel://:s3cret-pw@h:26379/0",
		"redis-sentinel://h:26379/0?master_name=m&password=s3cret-pw&addr=nope",
		"redis-cluster://:s3cret-pw@h:7000?bogus=1",
		"redis-ring://:s3cret-pw@h:1",
		"redis://:s3cret-pw@h:1/0?%zz",
		// go-redis would give up on WAIT's reply and send the write again.
		"redis://:s3cret-pw@h:1/0?wait_replicas=1&read_timeout=1s",
		"redis-sentinel://:s3cret-pw@h:26379/0?master_name=m&wait_replicas=1&wait_timeout=2s&read_timeout=2s",
		"redis-cluster://:s3cret-pw@h:7000?wait_replicas=1&read_timeout=1200ms",
		"redis://:s3cret-pw@h:1/0?wait_replicas=1&wait_timeout=5s", // against go-redis's default 3s
	} {
		_, err := parseRedisStoreURL(bad)
		if !errors.Is(err, errBadURL) {
			t.Errorf("%s: %v, want errBadURL", bad, err)
		} else if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: the error shows the password: %v", bad, err)
		}
	}
	// Through the commands: a usage error (status 2), no password.
	for _, args := range [][]string{
		{"proxy", "--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:1", "--store", "redis-sentinel://:s3cret-pw@127.0.0.1:1/0"},
		{"failed", "--store", "redis-cluster://:s3cret-pw@127.0.0.1:1?wait_replicas=one", "--consumer", "c"},
	} {
		code, stdout, stderr := run(t, args...)
		if code != 2 || !strings.Contains(stderr, "bad URL") || strings.Contains(stdout+stderr, "s3cret") {
			t.Errorf("%q: status %d, stdout %q, stderr %q; want 2 and a bad URL without the password", args, code, stdout, stderr)
		}
	}
}

// TestProxyCommandOnSentinel runs `idem proxy` on a Sentinel-managed
// Redis (scripts/services redis-ha: a master, a replica, a Sentinel)
// through a redis-sentinel:// store URL with wait_replicas=1: a key sent
// by four clients at once, then again, reaches the upstream once and
// every answer is the upstream's. It needs root to start redis-ha (skips
// without, fails under IDEM_TEST_REQUIRE_ALL=1).
func TestProxyCommandOnSentinel(t *testing.T) {
	t.Parallel()
	ha := ownservice.Start(t, "redis-ha")
	// ha.URL is redis://127.0.0.1:PORT?master_name=idem: the Sentinel.
	store := strings.Replace(ha.URL, "redis://", "redis-sentinel://", 1) + "&wait_replicas=1"
	up, n := countingUpstream(t)
	p := startProxy(t, "--upstream", up.URL, "--store", store, "--redis-prefix", "idem-px-sentinel:")
	client := &http.Client{Timeout: 30 * time.Second}
	post := func() (int, string, error) {
		req, _ := http.NewRequest(http.MethodPost, p.addr+"/payments", strings.NewReader(`{"amount":1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer alice")
		req.Header.Set("Idempotency-Key", `"sentinel-1"`)
		resp, err := client.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	// Four at once: one runs; the others answer 409 (in progress) until
	// it is recorded, then its replay.
	var wg sync.WaitGroup
	bodies := make([]string, 5)
	for i := range 4 {
		wg.Go(func() {
			for {
				code, body, err := post()
				if err != nil {
					t.Errorf("POST: %v", err)
					return
				}
				if code == http.StatusConflict {
					time.Sleep(10 * time.Millisecond) // a client's retry pace
					continue
				}
				if code != http.StatusCreated {
					t.Errorf("POST: %d %s", code, body)
				}
				bodies[i] = body
				return
			}
		})
	}
	wg.Wait()
	code, body, err := post()
	if err != nil || code != http.StatusCreated {
		t.Fatalf("the retry: %d %s %v", code, body, err)
	}
	bodies[4] = body
	for _, b := range bodies {
		if b != `{"id":1}` {
			t.Errorf("answers %q: want the one run's everywhere", bodies)
			break
		}
	}
	if n.Load() != 1 {
		t.Errorf("the upstream ran %d times, want once", n.Load())
	}
	if err := p.stop(t); err != nil {
		t.Errorf("idem proxy: %v", err)
	}
}

// countingUpstream is an upstream that answers every request 201 with
// {"id":N}, N counting its requests (the counter returned), closed at
// cleanup.
func countingUpstream(t *testing.T) (*httptest.Server, *atomic.Int64) {
	var n atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, n.Add(1))
	}))
	t.Cleanup(up.Close)
	return up, &n
}

package scenariotest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemtest"
)

// BenchmarkProxy measures, in one run, per store: requests straight to the
// upstream ("direct"), through net/http/httputil's ReverseProxy with no
// idempotency ("plain-proxy": the extra hop alone), through the proxy
// with a new key each ("new-key": Acquire with the recovery point,
// forward, Complete), and replays of one stored key ("replay": one Acquire
// that finds the record; the upstream is not called). The upstream
// answers 201 with a small JSON body after its service time: 0 (an
// upstream that does nothing: the proxy's worst case, where its own HTTP
// hop and store calls are all there is), 2ms and 10ms (a service that
// writes to a database). The memory store is a reference: the proxy's
// cost without a store round trip.
//
//	go test -run '^$' -bench BenchmarkProxy -benchtime 2000x -benchmem
//
// Each case runs with clients=32 (32 clients at a time, so a sleeping
// upstream does not leave the CPUs idle: throughput, bounded by the CPUs
// the client, the proxy, the upstream and the store share) and clients=1
// (one client, one request at a time: what a request waits, its
// latency). Each reports req/s, the mean time a request took from the
// client's side (µs/req), and the CPU time of this process (client, proxy
// and upstream; not the store's server) per request (cpu-µs/req), and
// the proxy's store calls per request (store-calls/req). With Redis it
// also runs "hand-proxy" and "hand-replay": a hand-written idempotent
// proxy with the same guarantee for a new key and a replay (handProxy),
// its store calls not counted; and the Redis server's CPU per request
// (server-cpu-µs/req, INFO cpu: valid only when nothing else uses the
// server).
func BenchmarkProxy(b *testing.B) {
	for _, st := range testStores {
		switch st.name {
		case "memory", "sqlite", "postgres", "redis":
		default:
			continue
		}
		b.Run(st.name, func(b *testing.B) {
			env := st.open(b)
			for _, work := range []time.Duration{0, 2 * time.Millisecond, 10 * time.Millisecond} {
				b.Run(fmt.Sprintf("upstream=%v", work), func(b *testing.B) {
					for _, clients := range []int{32, 1} {
						b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
							benchProxy(b, env, work, clients)
						})
					}
				})
			}
		})
	}
}

func benchProxy(b *testing.B, env testStoreEnv, work time.Duration, clients int) {
	var calls atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		n := calls.Add(1)
		if work > 0 {
			time.Sleep(work)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/x/%d", n))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d,"status":"accepted"}`, n)
	}))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	// The store's calls are counted: store-calls/req is the store round
	// trips of a request (new key: Acquire with its recovery point and
	// Complete; replay: Acquire), as the lease engine makes them.
	// Over a store with batches (idemdriver.LeaseBatcher) the counter is
	// one too, so that the consumer coalesces its calls (idem.Config.
	// Coalesce) as over the store itself; a batch call is one trip.
	counter := idemtest.CountCalls(env.store, false)
	var store idemdriver.LeaseStore = counter
	trips := func() int64 { return counter.Calls().Total() }
	if lb, ok := env.store.(idemdriver.LeaseBatcher); ok {
		bc := idemtest.CountBatches(lb, false)
		store = bc
		trips = func() int64 {
			a, c := bc.Batches()
			return bc.Calls().Total() + a + c
		}
	}
	p, err := idemhttp.NewProxy(u, store, &idemhttp.ProxyOptions{Options: idemhttp.Options{
		Namespace:     testRandName("bench-"),
		PurgeInterval: -1,
		Logger:        scQuietLogger(),
		Coalesce:      benchCoalesce(),
	}})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	px := httptest.NewServer(p)
	defer px.Close()
	tr := &http.Transport{MaxIdleConns: 512, MaxIdleConnsPerHost: 512}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}

	const body = `{"amount":1000,"currency":"EUR"}`
	send := func(target, key string) error {
		req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, target+"/payments", strings.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer bench")
		if key != "" {
			req.Header.Set(idemhttp.HeaderIdempotencyKey, key)
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
	var seq atomic.Int64
	prefix := testRandName("k")
	run := func(b *testing.B, target string, key func() string) {
		var next, waited atomic.Int64
		var wg sync.WaitGroup
		cpu0, calls0 := processCPU(), trips()
		var srv0 time.Duration
		if env.serverCPU != nil {
			srv0 = env.serverCPU()
		}
		b.ResetTimer()
		start := time.Now()
		for range clients {
			wg.Go(func() {
				for next.Add(1) <= int64(b.N) {
					t0 := time.Now()
					if err := send(target, key()); err != nil {
						b.Error(err)
						return
					}
					waited.Add(int64(time.Since(t0)))
				}
			})
		}
		wg.Wait()
		elapsed := time.Since(start)
		b.StopTimer()
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "req/s")
		b.ReportMetric(float64(waited.Load())/float64(b.N)/1e3, "µs/req")
		b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N)/1e3, "cpu-µs/req")
		b.ReportMetric(float64(trips()-calls0)/float64(b.N), "store-calls/req")
		if env.serverCPU != nil {
			b.ReportMetric(float64(env.serverCPU()-srv0)/float64(b.N)/1e3, "server-cpu-µs/req")
		}
	}
	b.Run("direct", func(b *testing.B) {
		run(b, up.URL, func() string { return fmt.Sprintf(`"%s-%d"`, prefix, seq.Add(1)) })
	})
	// plain-proxy is the same hop through net/http/httputil's
	// ReverseProxy with no idempotency: the ceiling any proxy has on
	// this machine, so new-key/plain-proxy is idem's own share.
	// Its Transport keeps idle connections as the proxy's default one
	// does (http.DefaultTransport keeps 2 a host, so 32 clients would
	// open and close a connection per request).
	plainTr := &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 256, IdleConnTimeout: idemhttp.DefaultUpstreamIdleTimeout}
	defer plainTr.CloseIdleConnections()
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = plainTr
	plain := httptest.NewServer(rp)
	defer plain.Close()
	b.Run("plain-proxy", func(b *testing.B) {
		run(b, plain.URL, func() string { return fmt.Sprintf(`"%s-%d"`, prefix, seq.Add(1)) })
	})
	// newKeys sends a new key each time through target: the upstream
	// runs once per request. replays sends key each time, once stored:
	// the upstream never runs.
	newKeys := func(b *testing.B, target string) {
		before := calls.Load()
		run(b, target, func() string { return fmt.Sprintf(`"%s-%d"`, prefix, seq.Add(1)) })
		if got := calls.Load() - before; got != int64(b.N) {
			b.Fatalf("upstream ran %d times for %d new keys", got, b.N)
		}
	}
	replays := func(b *testing.B, target, key string) {
		if err := send(target, key); err != nil {
			b.Fatal(err)
		}
		before := calls.Load()
		run(b, target, func() string { return key })
		if got := calls.Load() - before; got != 0 {
			b.Fatalf("replays reached the upstream %d times", got)
		}
	}
	b.Run("new-key", func(b *testing.B) { newKeys(b, px.URL) })
	if env.handProxy != nil {
		// hand-proxy: the hand-written idempotent proxy with the same
		// guarantee for a new key and a replay (handProxy): new-key /
		// hand-proxy is what idemhttp costs beyond the guarantee itself.
		hand := httptest.NewServer(env.handProxy(u))
		defer hand.Close()
		b.Run("hand-proxy", func(b *testing.B) { newKeys(b, hand.URL) })
		b.Run("hand-replay", func(b *testing.B) { replays(b, hand.URL, `"hand-replayed-key"`) })
	}
	b.Run("replay", func(b *testing.B) { replays(b, px.URL, `"replayed-key"`) })
}

// processCPU is the CPU time (user and system) this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchCoalesce is the lease consumer's Config.Coalesce in the benchmark:
// IDEM_BENCH_COALESCE (e.g. 64), 0 (the default, off) when unset.
func benchCoalesce() int {
	n, _ := strconv.Atoi(os.Getenv("IDEM_BENCH_COALESCE"))
	return n
}

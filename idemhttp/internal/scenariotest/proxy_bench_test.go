package scenariotest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/idemhttp"
)

// BenchmarkProxy measures, in one run, per store: requests straight to the
// upstream ("direct"), through the proxy with a new key each ("new-key":
// Acquire, forward, Complete), and replays of one stored key ("replay":
// one Acquire that finds the record; the upstream is not called). Each
// reports req/s. The upstream answers 201 with a small JSON body after
// its service time: 0 (an upstream that does nothing: the proxy's worst
// case, where its own HTTP hop and store calls are all there is), 2ms and
// 10ms (a service that writes to a database). The memory store is a
// reference: the proxy's cost without a store round trip.
//
//	go test -run '^$' -bench BenchmarkProxy -benchtime 2000x
//
// Clients run 32 at a time (SetParallelism), so a sleeping upstream does
// not leave the CPUs idle.
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
					benchProxy(b, env, work)
				})
			}
		})
	}
}

func benchProxy(b *testing.B, env testStoreEnv, work time.Duration) {
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
	p, err := idemhttp.NewProxy(u, env.store, &idemhttp.ProxyOptions{Options: idemhttp.Options{
		Namespace:     testRandName("bench-"),
		PurgeInterval: -1,
		Logger:        scQuietLogger(),
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
		b.SetParallelism(16)
		start := time.Now()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := send(target, key()); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
	}
	b.Run("direct", func(b *testing.B) {
		run(b, up.URL, func() string { return fmt.Sprintf(`"%s-%d"`, prefix, seq.Add(1)) })
	})
	// plain-proxy is the same hop through net/http/httputil's
	// ReverseProxy with no idempotency: the ceiling any proxy has on
	// this machine, so new-key/plain-proxy is idem's own share.
	plain := httptest.NewServer(httputil.NewSingleHostReverseProxy(u))
	defer plain.Close()
	b.Run("plain-proxy", func(b *testing.B) {
		run(b, plain.URL, func() string { return fmt.Sprintf(`"%s-%d"`, prefix, seq.Add(1)) })
	})
	b.Run("new-key", func(b *testing.B) {
		before := calls.Load()
		run(b, px.URL, func() string { return fmt.Sprintf(`"%s-%d"`, prefix, seq.Add(1)) })
		if got := calls.Load() - before; got != int64(b.N) {
			b.Fatalf("upstream ran %d times for %d new keys", got, b.N)
		}
	})
	b.Run("replay", func(b *testing.B) {
		const key = `"replayed-key"`
		if err := send(px.URL, key); err != nil {
			b.Fatal(err)
		}
		before := calls.Load()
		run(b, px.URL, func() string { return key })
		if got := calls.Load() - before; got != 0 {
			b.Fatalf("replays reached the upstream %d times", got)
		}
	})
}

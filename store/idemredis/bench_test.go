package idemredis_test

import (
	"context"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest"
	"github.com/redis/go-redis/v9"
)

// BenchmarkLeaseVsTwoStepSET measures lease mode on Redis per message
// against the least a hand-written lease on Redis costs: SET key NX PX
// (the claim, with an expiry) and then SET key value (the result), two
// round trips. One worker processes messages with a handler that does
// nothing, in interleaved rounds of 20 messages of each kind, so that
// both see the same machine load. Reported per message: lease-ns/msg and
// set-ns/msg (wall time), lease-allocs/msg and set-allocs/msg (heap
// allocations in the whole process, from runtime.MemStats.Mallocs), and
// ratio, the lease's throughput as a fraction of the two-step SET's
// (set-ns / lease-ns). lease-server-us/msg and set-server-us/msg are the
// Redis server's own time per message (INFO commandstats: EVALSHA and EVAL, against SET),
// the part of the gap that no client code can close: read them only
// when nothing else uses the server during the run.
func BenchmarkLeaseVsTwoStepSET(b *testing.B) {
	tb := setup(b, nil)
	ctx := context.Background()
	c, err := idem.NewLeaseConsumer(tb.store, idem.Config{Name: "bench", PurgeInterval: -1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	handler := func(context.Context, *idem.Attempt) (idem.Result, error) { return idem.Result{Body: []byte("ok")}, nil }
	plainPrefix := tb.prefix + "plain:"
	defer func() {
		// The plain keys are under the store's prefix: cleanup deletes them.
	}()
	const round = 20
	var (
		leaseT, setT           time.Duration
		leaseAllocs, setAllocs uint64
		msgs                   int
		ms                     runtime.MemStats
		n                      int
	)
	payload := []byte("payload")
	stats0 := commandUsec(b, tb.client)
	for b.Loop() {
		runtime.ReadMemStats(&ms)
		m0 := ms.Mallocs
		start := time.Now()
		for range round {
			n++
			out, err := c.Process(ctx, idem.Message{ID: "m" + strconv.Itoa(n), Payload: payload}, handler)
			if err != nil || out.Status != idem.Processed {
				b.Fatalf("Process: %v %v", out.Status, err)
			}
		}
		leaseT += time.Since(start)
		runtime.ReadMemStats(&ms)
		m1 := ms.Mallocs
		start = time.Now()
		for range round {
			key := plainPrefix + strconv.Itoa(n)
			n++
			ok, err := tb.client.SetNX(ctx, key, "in-progress", 30*time.Second).Result()
			if err != nil || !ok {
				b.Fatalf("SET NX: %v %v", ok, err)
			}
			if err := tb.client.Set(ctx, key, "ok", 24*time.Hour).Err(); err != nil {
				b.Fatal(err)
			}
		}
		setT += time.Since(start)
		runtime.ReadMemStats(&ms)
		leaseAllocs += m1 - m0
		setAllocs += ms.Mallocs - m1
		msgs += round
	}
	stats1 := commandUsec(b, tb.client)
	serverUs := func(cmds ...string) float64 {
		var us int64
		for _, c := range cmds {
			us += stats1[c] - stats0[c]
		}
		return float64(us) / float64(msgs)
	}
	b.ReportMetric(serverUs("evalsha", "eval"), "lease-server-us/msg")
	b.ReportMetric(serverUs("set"), "set-server-us/msg")
	b.ReportMetric(float64(leaseT.Nanoseconds())/float64(msgs), "lease-ns/msg")
	b.ReportMetric(float64(setT.Nanoseconds())/float64(msgs), "set-ns/msg")
	b.ReportMetric(float64(leaseAllocs)/float64(msgs), "lease-allocs/msg")
	b.ReportMetric(float64(setAllocs)/float64(msgs), "set-allocs/msg")
	b.ReportMetric(float64(setT)/float64(leaseT), "ratio")
}

// commandUsec returns the server's total time in microseconds per command
// name (lower case), from INFO commandstats: a script's time includes the
// commands it calls.
func commandUsec(tb testing.TB, client redis.UniversalClient) map[string]int64 {
	tb.Helper()
	info, err := client.Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatalf("INFO commandstats: %v", err)
	}
	usec := map[string]int64{}
	for line := range strings.Lines(info) {
		// cmdstat_set:calls=3,usec=12,usec_per_call=4.00,...
		name, fields, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "cmdstat_"), ":")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		for f := range strings.SplitSeq(fields, ",") {
			if v, ok := strings.CutPrefix(f, "usec="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					tb.Fatalf("INFO commandstats: %q: %v", line, err)
				}
				usec[name] = n
			}
		}
	}
	return usec
}

// BenchmarkLeaseRoundTrips reports lease mode's store calls per message
// (new, duplicate, release) with the store's StepRecorder capability and
// without it, and the time of a new message (idemtest.BenchmarkRoundTrips):
//
//	go test -run '^$' -bench BenchmarkLeaseRoundTrips -benchtime 20x
func BenchmarkLeaseRoundTrips(b *testing.B) {
	idemtest.BenchmarkRoundTrips(b, setup(b, nil).store, "bench-rt")
}

// BenchmarkLeaseRunPoint measures a new message processed the way the
// at-most-once front ends do it (idemhttp, idem consume): with its run
// point saved by the acquire (idem.AcquireOptions.StepPrefix, two store
// round trips) and, interleaved, as before the store recorded it (a
// SaveStep of its own after the acquire, three). Reported per message:
// ns and allocations (whole process, runtime.MemStats.Mallocs) of each,
// and ratio, before-ns / now-ns.
func BenchmarkLeaseRunPoint(b *testing.B) {
	tb := setup(b, nil)
	ctx := context.Background()
	c, err := idem.NewLeaseConsumer(tb.store, idem.Config{Name: "bench-rp", PurgeInterval: -1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	opt := idem.AcquireOptions{StepPrefix: "bench:run:"}
	now := func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
		return idem.Result{Body: []byte("ok")}, nil
	}
	before := func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
		if err := a.SaveStep(ctx, "bench:run:"+strconv.FormatInt(a.Token, 10), nil); err != nil {
			return idem.Result{}, err
		}
		return idem.Result{Body: []byte("ok")}, nil
	}
	const round = 20
	var (
		nowT, beforeT           time.Duration
		nowAllocs, beforeAllocs uint64
		msgs, n                 int
		ms                      runtime.MemStats
	)
	payload := []byte("payload")
	for b.Loop() {
		for _, withPoint := range []bool{true, false} {
			runtime.ReadMemStats(&ms)
			m0 := ms.Mallocs
			start := time.Now()
			for range round {
				n++
				msg := idem.Message{ID: "m" + strconv.Itoa(n), Payload: payload}
				var out idem.Outcome
				var err error
				if withPoint {
					out, err = c.ProcessWith(ctx, msg, opt, now)
				} else {
					out, err = c.Process(ctx, msg, before)
				}
				if err != nil || out.Status != idem.Processed {
					b.Fatalf("Process: %v %v", out.Status, err)
				}
			}
			d := time.Since(start)
			runtime.ReadMemStats(&ms)
			if withPoint {
				nowT += d
				nowAllocs += ms.Mallocs - m0
			} else {
				beforeT += d
				beforeAllocs += ms.Mallocs - m0
			}
		}
		msgs += round
	}
	b.ReportMetric(float64(nowT.Nanoseconds())/float64(msgs), "now-ns/msg")
	b.ReportMetric(float64(beforeT.Nanoseconds())/float64(msgs), "before-ns/msg")
	b.ReportMetric(float64(nowAllocs)/float64(msgs), "now-allocs/msg")
	b.ReportMetric(float64(beforeAllocs)/float64(msgs), "before-allocs/msg")
	b.ReportMetric(float64(beforeT)/float64(nowT), "ratio")
}

// BenchmarkHeldAttempts holds 10,000 lease-mode attempts at once on Redis
// (lease 30s, so renewed every 10s) for 12s after the last Acquire and reports the client process's goroutines, its
// live heap per attempt and the renewals (idemtest.BenchmarkHeldAttempts):
//
//	go test -run '^$' -bench BenchmarkHeldAttempts -benchtime 1x
func BenchmarkHeldAttempts(b *testing.B) {
	idemtest.BenchmarkHeldAttempts(b, setup(b, nil).store, "bench-held", 10000, 30*time.Second, 12*time.Second)
}

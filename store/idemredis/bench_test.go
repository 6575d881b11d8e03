package idemredis_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/store/idemredis"
	"github.com/redis/go-redis/v9"
)

// BenchmarkLeaseVsTwoStepSET measures lease mode on Redis per message
// against what a hand-written lease on Redis costs, with 1 and with 8
// workers processing messages at once (workers=N), in interleaved rounds
// of 20 messages per worker of each kind, so that all four see the same
// machine load:
//   - set: SET key NX PX (the claim, with an expiry) and then SET key
//     value (the result), two round trips and no fencing token: the least
//     a lease costs;
//   - hand: a hand-written Lua lease with a fencing token (handAcquire,
//     handComplete: a hash per key with its token, its lease's end by the
//     server's clock and its result; the result written only by the token
//     that holds the key), two round trips: the same guarantee as lease
//     mode's core, without its fingerprint, recovery points, attempt count
//     or retention index;
//   - handidx: hand with what lease mode keeps beyond it that costs the
//     server a command: the payload's fingerprint, stored by the acquire
//     and compared when the key exists (handIdxAcquire), and the
//     retention index, scored by the server's clock when the result is
//     written (handIdxComplete): a hand-written fenced lease with the
//     guarantee lease mode gives a message processed once;
//   - lease: idem.LeaseConsumer.Process with a handler that does nothing.
//
// Reported per message, for each kind: ns/msg (wall time), allocs/msg
// (heap allocations in the whole process, runtime.MemStats.Mallocs),
// cpu-us/msg (this process's CPU, getrusage), server-us/msg (the Redis
// server's time in its commands, INFO commandstats: EVALSHA and EVAL, or
// SET) and server-cpu-us/msg (the server process's CPU, INFO cpu, network
// included); and ratio (set-ns / lease-ns) and hand-ratio (hand-ns /
// lease-ns) and handidx-ratio (handidx-ns / lease-ns), the lease's
// throughput as a fraction of each. The server
// figures count every client of the server: read them only when nothing
// else uses it during the run.
func BenchmarkLeaseVsTwoStepSET(b *testing.B) {
	for _, workers := range []int{1, 8} {
		b.Run("workers="+strconv.Itoa(workers), func(b *testing.B) { benchLeaseVsSET(b, workers) })
	}
}

// The hand-written fenced leases (idemredis.HandAcquireLua and the
// others: see there).
var (
	handAcquire     = redis.NewScript(idemredis.HandAcquireLua)
	handComplete    = redis.NewScript(idemredis.HandCompleteLua)
	handIdxAcquire  = redis.NewScript(idemredis.HandIdxAcquireLua)
	handIdxComplete = redis.NewScript(idemredis.HandIdxCompleteLua)
)

// leaseKind is one of BenchmarkLeaseVsTwoStepSET's contenders: its totals.
type leaseKind struct {
	name             string
	d                time.Duration
	allocs           uint64
	cpu              time.Duration
	serverUs, srvCPU float64
	run              func(w, i int) error // process message i of worker w
}

func benchLeaseVsSET(b *testing.B, workers int) {
	tb := setup(b, nil)
	ctx := context.Background()
	c, err := idem.NewLeaseConsumer(tb.store, idem.Config{Name: "bench", PurgeInterval: -1, Logger: slog.New(slog.DiscardHandler),
		Coalesce: benchCoalesce()})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	handler := func(context.Context, *idem.Attempt) (idem.Result, error) { return idem.Result{Body: []byte("ok")}, nil }
	// The plain and hand-written keys are under the store's prefix: the
	// cleanup deletes them.
	plainPrefix, handPrefix, handIdxPrefix := tb.prefix+"plain:", tb.prefix+"hand:", tb.prefix+"handidx:"
	payload := []byte("payload")
	id := func(w, i int) string { return strconv.Itoa(w) + "-" + strconv.Itoa(i) }
	kinds := []*leaseKind{
		{name: "lease", run: func(w, i int) error {
			out, err := c.Process(ctx, idem.Message{ID: "m" + id(w, i), Payload: payload}, handler)
			if err == nil && out.Status != idem.Processed {
				err = fmt.Errorf("status %v", out.Status)
			}
			return err
		}},
		{name: "set", run: func(w, i int) error {
			key := plainPrefix + id(w, i)
			ok, err := tb.client.SetNX(ctx, key, "in-progress", 30*time.Second).Result()
			if err != nil || !ok {
				return fmt.Errorf("SET NX: %v %v", ok, err)
			}
			return tb.client.Set(ctx, key, "ok", 24*time.Hour).Err()
		}},
		{name: "hand", run: func(w, i int) error {
			key := []string{handPrefix + id(w, i)}
			token, err := handAcquire.Run(ctx, tb.client, key, 30000).Int64()
			if err != nil || token < 1 {
				return fmt.Errorf("hand acquire: %d %v", token, err)
			}
			if n, err := handComplete.Run(ctx, tb.client, key, token, "ok").Int64(); err != nil || n != 1 {
				return fmt.Errorf("hand complete: %d %v", n, err)
			}
			return nil
		}},
		{name: "handidx", run: func(w, i int) error {
			keys := []string{handIdxPrefix + id(w, i), handIdxPrefix + "done"}
			fp := "0123456789abcdef0123456789abcdef" // a SHA-256's length
			token, err := handIdxAcquire.Run(ctx, tb.client, keys[:1], 30000, fp).Int64()
			if err != nil || token < 1 {
				return fmt.Errorf("handidx acquire: %d %v", token, err)
			}
			if n, err := handIdxComplete.Run(ctx, tb.client, keys, token, "ok", id(w, i)).Int64(); err != nil || n != 1 {
				return fmt.Errorf("handidx complete: %d %v", n, err)
			}
			return nil
		}},
	}
	const round = 20
	var (
		msgs, n int
		ms      runtime.MemStats
	)
	for b.Loop() {
		for _, k := range kinds {
			s0 := serverStats(b, tb.client)
			runtime.ReadMemStats(&ms)
			m0, cpu0 := ms.Mallocs, processCPU()
			start := time.Now()
			var wg sync.WaitGroup
			errs := make([]error, workers)
			for w := range workers {
				wg.Go(func() {
					for i := range round {
						if err := k.run(w, n+i); err != nil {
							errs[w] = err
							return
						}
					}
				})
			}
			wg.Wait()
			k.d += time.Since(start)
			k.cpu += processCPU() - cpu0
			runtime.ReadMemStats(&ms)
			k.allocs += ms.Mallocs - m0
			s1 := serverStats(b, tb.client)
			if err := errors.Join(errs...); err != nil {
				b.Fatalf("%s: %v", k.name, err)
			}
			for _, cmd := range []string{"evalsha", "eval", "set"} {
				k.serverUs += s1[cmd] - s0[cmd]
			}
			k.srvCPU += s1[cpuStat] - s0[cpuStat]
		}
		n += round
		msgs += round * workers
	}
	for _, k := range kinds {
		per := func(x float64) float64 { return x / float64(msgs) }
		b.ReportMetric(per(float64(k.d.Nanoseconds())), k.name+"-ns/msg")
		b.ReportMetric(per(float64(k.allocs)), k.name+"-allocs/msg")
		b.ReportMetric(per(float64(k.cpu.Microseconds())), k.name+"-cpu-us/msg")
		b.ReportMetric(per(k.serverUs), k.name+"-server-us/msg")
		b.ReportMetric(per(k.srvCPU), k.name+"-server-cpu-us/msg")
	}
	b.ReportMetric(float64(kinds[1].d)/float64(kinds[0].d), "ratio")
	b.ReportMetric(float64(kinds[2].d)/float64(kinds[0].d), "hand-ratio")
	b.ReportMetric(float64(kinds[3].d)/float64(kinds[0].d), "handidx-ratio")
}

// cpuStat is serverStats's key for the server process's CPU time.
const cpuStat = "~cpu"

// serverStats returns the server's total time in microseconds per command
// name (lower case), from INFO commandstats (a script's time includes the
// commands it calls), and under cpuStat its process's CPU time in
// microseconds (INFO cpu: used_cpu_sys + used_cpu_user).
func serverStats(tb testing.TB, client redis.UniversalClient) map[string]float64 {
	tb.Helper()
	info, err := client.Info(context.Background(), "commandstats", "cpu").Result()
	if err != nil {
		tb.Fatalf("INFO commandstats cpu: %v", err)
	}
	usec := map[string]float64{}
	for line := range strings.Lines(info) {
		line = strings.TrimSpace(line)
		for _, k := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(line, k); ok {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					tb.Fatalf("INFO cpu: %q: %v", line, err)
				}
				usec[cpuStat] += f * 1e6
			}
		}
		// cmdstat_set:calls=3,usec=12,usec_per_call=4.00,...
		name, fields, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":")
		if !ok || !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		for f := range strings.SplitSeq(fields, ",") {
			if v, ok := strings.CutPrefix(f, "usec="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					tb.Fatalf("INFO commandstats: %q: %v", line, err)
				}
				usec[name] = float64(n)
			}
		}
	}
	return usec
}

// processCPU returns this process's CPU time so far (user and system).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
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

// benchCoalesce is the lease consumer's Config.Coalesce in the benchmark:
// IDEM_BENCH_COALESCE (e.g. 64), 0 (the default, off) when unset.
func benchCoalesce() int {
	n, _ := strconv.Atoi(os.Getenv("IDEM_BENCH_COALESCE"))
	return n
}

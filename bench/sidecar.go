package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// envNATS names the NATS server (JetStream, with a network listener) the
// --sidecar mode runs on; scripts/services sets it. envBaseBin, when set,
// names another idem binary (an earlier build, with --store-batch and
// --hold) that --sidecar runs too, on every store with the same batched
// flags, each beside the binary built here, as a baseline.
const (
	envNATS    = "IDEM_TEST_NATS_URL"
	envBaseBin = "IDEM_BENCH_BASE_IDEM"
	// envProfileDir, when set, names a directory where each run of idem
	// consume (the binary built here) writes a CPU profile and an
	// allocation profile, TAG-N.cpu and TAG-N.allocs (N the contender's
	// index, TAG the round's), for go tool pprof.
	envProfileDir = "IDEM_BENCH_SIDECAR_PROFILE"
	// envOnly, when set, is a regular expression: only the contenders
	// whose name matches it run beside the bare relay.
	envOnly = "IDEM_BENCH_SIDECAR_ONLY"
	// envNoDirect, when set to 1, leaves out the direct Go consumers (a
	// few hundred messages a second on SQLite: the longest runs).
	envNoDirect = "IDEM_BENCH_SIDECAR_NO_DIRECT"
	// envBin, when set, names the idem binary to measure instead of one
	// built from ./cmd/idem (which must have the hidden --memstats flag).
	envBin = "IDEM_BENCH_IDEM"
)

// sidecarService is the do-nothing HTTP service of --sidecar: it answers
// 200 to every POST and, per path (one per run), counts the distinct
// Idempotency-Keys it saw and the times of the first and of the one that
// made the count reach the run's target.
type sidecarService struct {
	mu   sync.Mutex
	runs map[string]*serviceRun
}

type serviceRun struct {
	target      int
	keys        map[string]struct{}
	calls       int
	first, last time.Time
	reached     chan struct{}
}

func (s *sidecarService) expect(path string, target int) *serviceRun {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := &serviceRun{target: target, keys: map[string]struct{}{}, reached: make(chan struct{})}
	s.runs[path] = r
	return r
}

func (s *sidecarService) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	now := time.Now()
	s.mu.Lock()
	if run := s.runs[r.URL.Path]; run != nil {
		run.calls++
		if run.first.IsZero() {
			run.first = now
		}
		key := r.Header.Get("Idempotency-Key")
		if _, dup := run.keys[key]; !dup {
			run.keys[key] = struct{}{}
			if len(run.keys) == run.target {
				run.last = now
				close(run.reached)
			}
		}
	}
	s.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

// sidecarContender is one way of moving the messages of a subject to the
// service: the bare relay, or `idem consume` on a store.
type sidecarContender struct {
	name string
	// start begins consuming subject (stream stream) into url; stop ends it
	// and returns what its process used (zero when it runs in this
	// process).
	start func(ctx context.Context, stream, subject, url, tag string) (stop func() usage, err error)
	// prepare, when set, readies the contender's store for a run of n
	// messages (see prefillRows) before the run's CPU is first sampled.
	prepare func(ctx context.Context, tag string, n int) error
}

// usage is what a contender's process used in a run: CPU time, user and
// system, and the allocations its runtime counted (zero when unknown).
type usage struct {
	cpu            time.Duration
	mallocs, bytes uint64
	maxRSS         int64 // kilobytes (getrusage's ru_maxrss on Linux)
	// storeCalls and storeTrips are the claims and completions idem
	// consume sent to its store and the batches they went in (store
	// round trips, one commit each); zero when unknown.
	storeCalls, storeTrips uint64
	// The same for claims and completions apart, and the completion
	// batches and the completions in them by size class (1, 2-3, 4-7,
	// ..., 64 and more); zero when unknown (a binary that does not
	// write them).
	acquireCalls, acquireTrips   uint64
	completeCalls, completeTrips uint64
	completeBatches, completeIn  [sizeClasses]uint64
}

// sizeClasses is the number of batch size classes idem consume's
// --memstats reports (leasebatch.SizeClasses).
const sizeClasses = 7

// parseMemStats reads idem consume's --memstats file into u: lines of a
// name and numbers; names it does not know are skipped.
func parseMemStats(b []byte, u *usage) {
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		nums := make([]uint64, 0, len(f)-1)
		for _, w := range f[1:] {
			x, err := strconv.ParseUint(w, 10, 64)
			if err != nil {
				break
			}
			nums = append(nums, x)
		}
		if len(nums) == 0 {
			continue
		}
		one := map[string]*uint64{"mallocs": &u.mallocs, "bytes": &u.bytes, "store_calls": &u.storeCalls,
			"store_round_trips": &u.storeTrips, "acquire_calls": &u.acquireCalls, "acquire_round_trips": &u.acquireTrips,
			"complete_calls": &u.completeCalls, "complete_round_trips": &u.completeTrips}
		if p, ok := one[f[0]]; ok {
			*p = nums[0]
		}
		switch f[0] {
		case "complete_batches":
			copy(u.completeBatches[:], nums)
		case "complete_calls_in":
			copy(u.completeIn[:], nums)
		}
	}
}

// sidecarResult is one run's figures.
type sidecarResult struct {
	contender string
	rate      float64 // distinct messages per second, first call to the last new one
	calls     int     // calls the service received
	used      usage   // the contender's process
	// cpu is the CPU this process (the service, and the contender when
	// it runs here) and the watched servers used from the contender's
	// start to its stop.
	cpu cpuSample
}

// runSidecar measures `idem consume` against a bare Go relay that only
// fetches from JetStream, POSTs and acks (nats.go's Fetch, the same
// concurrency), or, with envSidecarBroker=kafka, polls kfake, POSTs and
// commits (kafkaBus), or, with envSidecarBroker=redis, reads a Redis
// stream, POSTs and XACKs (redisStreamBus), with a do-nothing HTTP service in this process: n messages
// per run, rounds rounds with the contenders interleaved; throughput is
// distinct messages the service received per second, from its first call
// to the call that completed the set. Stores: SQLite, and PostgreSQL and
// Redis when their URLs are set, each with the store batches of idem
// consume (--store-batch 64: with --hold 64, with --hold 64
// --point-at-call, and by default) and without (--store-batch 1), and,
// on SQLite and PostgreSQL, a direct Go consumer on the same store
// (directConsumer) that each idem consume run is also compared with, and
// on every store the hand-written sidecar (handContender: the same
// guarantees, two store round trips, or on SQLite two transactions, per
// fetched batch), the reference each idem consume run is compared with
// too. The idem binary is built
// from ./cmd/idem unless envBin names one.
func runSidecar(ctx context.Context, w, log io.Writer, n, rounds, concurrency int) error {
	procs, err := watchedProcs()
	if err != nil {
		return err
	}
	var bus sidecarBus
	var js jetstream.JetStream // set on NATS: the direct Go consumers' broker
	switch b := os.Getenv(envSidecarBroker); b {
	case "", "nats":
		natsURL := os.Getenv(envNATS)
		if natsURL == "" {
			return fmt.Errorf("--sidecar needs a NATS server with JetStream: set %s (scripts/services prints it)", envNATS)
		}
		nb, err := newNATSBus(natsURL)
		if err != nil {
			return err
		}
		bus, js = nb, nb.js
	case "kafka":
		kb, err := newKafkaBus(ctx)
		if err != nil {
			return err
		}
		bus = kb
	case "redis":
		redisURL := os.Getenv(envRedis)
		if redisURL == "" {
			return fmt.Errorf("%s=redis needs a Redis: set %s (scripts/services prints it)", envSidecarBroker, envRedis)
		}
		rb, err := newRedisStreamBus(redisURL)
		if err != nil {
			return err
		}
		bus = rb
	default:
		return fmt.Errorf("%s: %q: want nats, kafka or redis", envSidecarBroker, b)
	}
	defer bus.close()
	dir, err := os.MkdirTemp("", "idem-bench-sidecar-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin := os.Getenv(envBin)
	if bin == "" {
		bin = filepath.Join(dir, "idem")
		if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/idem").CombinedOutput(); err != nil {
			return fmt.Errorf("building ./cmd/idem (run from the repository root): %v\n%s", err, out)
		}
	}
	svc := &sidecarService{runs: map[string]*serviceRun{}}
	srv := httptest.NewServer(svc)
	defer srv.Close()

	var rb [3]byte
	_, _ = rand.Read(rb[:])
	runID := hex.EncodeToString(rb[:])
	contenders := []sidecarContender{{name: "bare relay", start: bus.bareRelay(concurrency)}}
	kb, onKafka := bus.(*kafkaBus)
	if onKafka {
		contenders = append(contenders, sidecarContender{name: "bare relay, key order", start: kb.bareRelayByKey(concurrency)})
	}
	stores := []struct{ name, url string }{{"sqlite", "sqlite:" + filepath.Join(dir, "STORE.db")}}
	if u := postgresURL(); u != "" {
		stores = append(stores, struct{ name, url string }{"postgres", u})
	}
	if u := os.Getenv(envRedis); u != "" {
		stores = append(stores, struct{ name, url string }{"redis", u})
	}
	base := os.Getenv(envBaseBin)
	baseDir := ""
	if base != "" && exec.CommandContext(ctx, base, "consume", "--memstats", os.DevNull, "--help").Run() == nil {
		baseDir = dir // an earlier build with --memstats
	}
	// An earlier build may not have --batch-claim: its contender then
	// runs only in this build.
	baseBatchClaim := base != "" && exec.CommandContext(ctx, base, "consume", "--batch-claim", "--help").Run() == nil
	for _, st := range stores {
		if st.name != "redis" && js != nil && os.Getenv(envNoDirect) != "1" { // the bench module has no Redis store; the direct consumer is on JetStream
			direct := st.url
			if st.name == "sqlite" {
				direct = "sqlite"
			}
			contenders = append(contenders, sidecarContender{
				fmt.Sprintf("direct Go consumer, %s", st.name),
				directConsumer(js, dir, direct, concurrency), nil,
			})
		}
		// On PostgreSQL each run's table is made and filled beforehand
		// (see prefillRows).
		var prepHand func(ctx context.Context, tag string, n int) error
		prepIdem := func(string) func(ctx context.Context, tag string, n int) error { return nil }
		if st.name == "postgres" {
			url := st.url
			prepHand = func(ctx context.Context, tag string, n int) error { return prefillHandPG(ctx, url, tag, n) }
			prepIdem = func(bin string) func(ctx context.Context, tag string, n int) error {
				return func(ctx context.Context, tag string, n int) error { return prefillIdemPG(ctx, bin, url, tag, n) }
			}
		}
		if open := handOpener(st.name, st.url); open != nil && js != nil {
			// One batch loop of 64, and two of 32: the same hold as
			// --hold 64, with one loop's store round trips while the
			// other's calls run.
			contenders = append(contenders, sidecarContender{
				"hand-written sidecar, " + st.name,
				handContender(js, open, 1, 64, concurrency), prepHand,
			}, sidecarContender{
				"hand-written sidecar, " + st.name + ", 2 loops of 32",
				handContender(js, open, 2, 32, concurrency), prepHand,
			})
		}
		// Store batches of the messages claimed ahead (--hold 64: more
		// outcome-unknown dead letters after a crash, at most once), and
		// the same with --point-at-call (no more of them, a write of its
		// own per message that waits for a call); the defaults at most
		// once: store batches of the messages in flight only (--hold is
		// --concurrency); no batches at all; and the fetched batch
		// claimed and completed in one store call each (--batch-claim:
		// on NATS 64 held in two batches at a time, and so on Redis
		// Streams, one XREADGROUP's entries a batch; on Kafka a batch of
		// 64/concurrency records per partition, concurrency partitions
		// at once, and, with --hold 256, batches four times larger).
		variants := []struct {
			batch int
			extra []string
		}{{64, []string{"--hold", "64"}}, {64, []string{"--hold", "64", "--point-at-call"}}, {64, nil}, {1, nil},
			{64, []string{"--hold", "64", "--batch-claim"}}}
		if onKafka {
			variants = append(variants, struct {
				batch int
				extra []string
			}{64, []string{"--hold", "256", "--batch-claim"}})
		}
		for _, v := range variants {
			flags := strings.Join(append([]string{fmt.Sprintf("--store-batch %d", v.batch)}, v.extra...), " ")
			contenders = append(contenders, sidecarContender{
				fmt.Sprintf("idem consume, %s, %s", st.name, flags),
				idemConsume(bin, bus.url(), st.url, v.batch, concurrency, dir, v.extra...), prepIdem(bin),
			})
			if onKafka && len(v.extra) == 2 { // --hold 64: the records in flight under key order
				keyed := append(slices.Clone(v.extra), "--kafka-order", "key")
				contenders = append(contenders, sidecarContender{
					fmt.Sprintf("idem consume, %s, %s --kafka-order key", st.name, flags),
					idemConsume(bin, bus.url(), st.url, v.batch, concurrency, dir, keyed...), prepIdem(bin),
				})
			}
			if base != "" && v.batch > 1 && (baseBatchClaim || !slices.Contains(v.extra, "--batch-claim")) {
				contenders = append(contenders, sidecarContender{
					fmt.Sprintf("idem consume (%s), %s, %s", filepath.Base(base), st.name, flags),
					idemConsume(base, bus.url(), st.url, v.batch, concurrency, baseDir, v.extra...), prepIdem(base),
				})
			}
		}
	}
	if only := os.Getenv(envOnly); only != "" {
		re, err := regexp.Compile(only)
		if err != nil {
			return fmt.Errorf("%s: %w", envOnly, err)
		}
		contenders = slices.DeleteFunc(contenders, func(c sidecarContender) bool {
			return !strings.HasPrefix(c.name, "bare relay") && !isReference(c.name) && !re.MatchString(c.name)
		})
	}
	results := map[string][]sidecarResult{}
	for round := range rounds + 1 { // round 0 warms up and is discarded
		for i, c := range contenders {
			tag := fmt.Sprintf("sc_%s_%d_%d", runID, round, i)
			r, err := sidecarRun(ctx, bus, svc, srv.URL, c, tag, n, procs)
			if err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			if log != nil {
				fmt.Fprintf(log, "sidecar round %d: %s: %.0f msgs/s (%d calls)%s\n", round, c.name, r.rate, r.calls, roundCPU(r, procs, n))
			}
			if round > 0 {
				results[c.name] = append(results[c.name], r)
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| contender | msgs/s median (min–max), %d runs | × bare relay (median of per-round ratios; key-order contenders × the key-order relay) | service calls / messages | CPU µs / message (idem consume's process, median) | × direct Go consumer, same store (median of per-round ratios) | × hand-written sidecar, same store (median of per-round ratios) | allocations / message (median) | allocated bytes / message (median) | max RSS MiB (median) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n", rounds)
	bare := results["bare relay"]
	for _, c := range contenders {
		rs := results[c.name]
		rates := make([]float64, len(rs))
		ratios := make([]float64, len(rs))
		cpus := make([]float64, len(rs))
		mallocs := make([]float64, len(rs))
		bytes := make([]float64, len(rs))
		rss := make([]float64, len(rs))
		// The direct Go consumer of the same store (the second
		// comma-separated part of the name), when there is one.
		var direct, hand []sidecarResult
		if parts := strings.Split(c.name, ", "); len(parts) > 1 && !isReference(c.name) {
			direct = results["direct Go consumer, "+parts[1]]
			hand = results["hand-written sidecar, "+parts[1]]
		}
		// A key-order contender is measured against the relay with the
		// same order, when that relay ran.
		relay := bare
		if keyed := results["bare relay, key order"]; keyed != nil && strings.HasSuffix(c.name, "--kafka-order key") {
			relay = keyed
		}
		var toDirect, toHand []float64
		calls := 0
		for i, r := range rs {
			rates[i], ratios[i] = r.rate, r.rate/relay[i].rate
			cpus[i] = float64(r.used.cpu.Microseconds()) / float64(n)
			mallocs[i], bytes[i] = float64(r.used.mallocs)/float64(n), float64(r.used.bytes)/float64(n)
			rss[i] = float64(r.used.maxRSS) / 1024
			if i < len(direct) {
				toDirect = append(toDirect, r.rate/direct[i].rate)
			}
			if i < len(hand) {
				toHand = append(toHand, r.rate/hand[i].rate)
			}
			calls += r.calls
		}
		fmt.Fprintf(&b, "| %s | %.0f (%.0f–%.0f) | %.2f | %.3f | %s | %s | %s | %s | %s | %s |\n", c.name, median(rates), slices.Min(rates), slices.Max(rates),
			median(ratios), float64(calls)/float64(n*len(rs)), orDash(median(cpus)), medianOrDash(toDirect), medianOrDash(toHand), orDash(median(mallocs)), orDash(median(bytes)), orDash(median(rss)))
	}
	writeSidecarCPU(&b, contenders, results, procs, n)
	writeSidecarBatches(&b, contenders, results)
	_, err = io.WriteString(w, b.String())
	return err
}

// isReference reports whether the contender named name is one idem
// consume is compared with on its store (a direct Go consumer, the
// hand-written sidecar): those run whatever envOnly says.
func isReference(name string) bool {
	return strings.HasPrefix(name, "direct Go consumer") || strings.HasPrefix(name, "hand-written sidecar")
}

// medianOrDash formats the median of ratios with two decimals, or "–"
// when there are none.
func medianOrDash(ratios []float64) string {
	if len(ratios) == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", median(ratios))
}

// orDash formats a per-message figure, or "–" when it was not measured.
func orDash(x float64) string {
	if x <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f", x)
}

// median of xs (not empty), sorting a copy.
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// sidecarRun publishes n messages to a new stream (topic), runs c until
// the service has had every one, and stops it.
func sidecarRun(ctx context.Context, bus sidecarBus, svc *sidecarService, base string, c sidecarContender, tag string, n int, procs []watchedProc) (sidecarResult, error) {
	stream, subject, cleanup, err := bus.publish(ctx, tag, n, []byte(`{"amount_cents":1250,"currency":"EUR"}`))
	if err != nil {
		return sidecarResult{}, err
	}
	defer cleanup()
	path := "/" + tag
	run := svc.expect(path, n)
	if c.prepare != nil {
		if err := c.prepare(ctx, tag, n*prefillRows); err != nil {
			return sidecarResult{}, err
		}
	}
	cpu0 := sampleCPU(procs)
	endProfile := profileSelf(c.name, tag)
	defer endProfile()
	stop, err := c.start(ctx, stream, subject, base+path, tag)
	if err != nil {
		return sidecarResult{}, err
	}
	select {
	case <-run.reached:
	case <-time.After(10 * time.Minute):
		stop()
		return sidecarResult{}, fmt.Errorf("the service had %d of %d messages after 10 minutes", len(run.keys), n)
	case <-ctx.Done():
		stop()
		return sidecarResult{}, ctx.Err()
	}
	used := stop()
	endProfile()
	cpu := sampleCPU(procs).sub(cpu0)
	svc.mu.Lock()
	defer svc.mu.Unlock()
	return sidecarResult{contender: c.name, rate: float64(n) / run.last.Sub(run.first).Seconds(), calls: run.calls, used: used, cpu: cpu}, nil
}

// bareRelay is the contender that only moves messages: a durable pull
// consumer fetched 64 at a time (nats.go's Fetch), concurrency workers
// that POST each message with its ID as Idempotency-Key and ack it after
// a 2xx.
func (b *natsBus) bareRelay(concurrency int) func(ctx context.Context, stream, subject, url, tag string) (func() usage, error) {
	return func(ctx context.Context, stream, _, url, _ string) (func() usage, error) {
		cons, err := b.js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "bare", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second})
		if err != nil {
			return nil, err
		}
		ctx, cancel := context.WithCancel(ctx)
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: concurrency}}
		work := make(chan jetstream.Msg)
		var wg sync.WaitGroup
		var failed atomic.Int64
		for range concurrency {
			wg.Go(func() {
				for m := range work {
					req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(string(m.Data())))
					if err != nil {
						failed.Add(1)
						continue
					}
					req.Header.Set("Idempotency-Key", m.Headers().Get(nats.MsgIdHdr))
					resp, err := client.Do(req)
					if err != nil {
						_ = m.Nak()
						continue
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode/100 == 2 {
						_ = m.Ack()
					} else {
						_ = m.Nak()
					}
				}
			})
		}
		wg.Go(func() {
			defer close(work)
			for ctx.Err() == nil {
				batch, err := cons.Fetch(64, jetstream.FetchMaxWait(time.Second))
				if err != nil {
					continue
				}
				for m := range batch.Messages() {
					select {
					case work <- m:
					case <-ctx.Done():
						return
					}
				}
			}
		})
		return func() usage { cancel(); wg.Wait(); client.CloseIdleConnections(); return usage{} }, nil
	}
}

// idemConsume is the contender `idem consume` on store (a URL; STORE in
// a sqlite path is replaced by the run's tag), a process of its own with
// --concurrency and --store-batch (none when batch is 0, for a binary
// without the flag) and the flags of extra, stopped by an interrupt.
// When dir is set (a binary with the hidden --memstats flag) it writes
// its allocation counters there, and its profiles to envProfileDir when
// that is set.
func idemConsume(bin, natsURL, store string, batch, concurrency int, dir string, extra ...string) func(ctx context.Context, stream, subject, url, tag string) (func() usage, error) {
	return func(ctx context.Context, _, subject, url, tag string) (func() usage, error) {
		args := []string{"consume", "--broker", natsURL, "--from", subject, "--to", url,
			"--store", strings.ReplaceAll(store, "STORE", tag), "--consumer", tag, "--group", tag,
			"--concurrency", fmt.Sprint(concurrency), "--log-level", "warn"}
		if batch > 0 {
			args = append(args, "--store-batch", fmt.Sprint(batch))
		}
		args = append(args, extra...)
		var stats string
		if dir != "" {
			stats = filepath.Join(dir, tag+".memstats")
			args = append(args, "--memstats", stats)
			if p := os.Getenv(envProfileDir); p != "" {
				args = append(args, "--cpuprofile", filepath.Join(p, tag+".cpu"), "--memprofile", filepath.Join(p, tag+".allocs"))
			}
		}
		switch {
		case strings.HasPrefix(store, "postgres"):
			args = append(args, "--table", tag)
		case strings.HasPrefix(store, "redis"):
			args = append(args, "--redis-prefix", tag+":")
		}
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		return func() usage {
			_ = cmd.Process.Signal(os.Interrupt)
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
			u := usage{cpu: cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()}
			if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
				u.maxRSS = ru.Maxrss
			}
			if stats != "" {
				if b, err := os.ReadFile(stats); err == nil {
					parseMemStats(b, &u)
				}
			}
			return u
		}, nil
	}
}

// profileSelf starts a CPU profile of this process, TAG-hand.cpu in
// envProfileDir, when that is set and the contender named name runs
// here (the hand-written sidecar), and returns what ends it (safe to
// call twice). The profile has the do-nothing service's work too: its
// goroutines are net/http's server's ((*conn).serve).
func profileSelf(name, tag string) func() {
	dir := os.Getenv(envProfileDir)
	if dir == "" || !strings.HasPrefix(name, "hand-written sidecar") {
		return func() {}
	}
	f, err := os.Create(filepath.Join(dir, tag+"-hand.cpu"))
	if err != nil {
		return func() {}
	}
	if pprof.StartCPUProfile(f) != nil {
		f.Close()
		return func() {}
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			pprof.StopCPUProfile()
			f.Close()
		})
	}
}

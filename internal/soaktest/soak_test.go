package soaktest

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/faultproxy"
)

var (
	soakDuration = flag.Duration("soak.duration", 2*time.Minute, "how long the soak injects faults under load")
	soakSeed     = flag.Uint64("soak.seed", 0, "the seed of the fault schedule (0: a random one, printed)")
	soakRate     = flag.Int("soak.rate", 20, "messages published per second per pipeline")
)

// members is how many consumer processes each pipeline runs in its
// consumer group.
const members = 2

// drainTimeout bounds the wait, after the faults stop, for every message
// to be processed and every outbox message sent.
const drainTimeout = 5 * time.Minute

// pipeline is one store and broker pair under the soak, seen from the
// test's process.
type pipeline interface {
	// name is the consumer role, as runRole knows it.
	name() string
	// env is the consumer process's environment.
	env() []string
	// publish sends message id with payload; an error leaves the outcome
	// unknown (publish is called again with the same id).
	publish(ctx context.Context, id string, payload []byte) error
	// drained reports whether every message in ids has its effect and
	// nothing is pending, with an account of what is missing.
	drained(ctx context.Context, ids []string) (bool, string)
	// check adds the pipeline's verdict on the history to r.
	check(ctx context.Context, ids []string, r *result)
	// faults are the pipeline's servers' faults.
	faults() []fault
}

// local is a pipeline whose consumers run in the test's process (it has
// no process to kill): memory-clock.
type local interface{ local() }

// fault is one kind of fault the scheduler may inject: do injects it with
// the scheduler's random source and returns what it did.
type fault struct {
	kind string
	do   func(rng *rand.Rand) (string, error)
}

// result is one pipeline's account of the history.
type result struct {
	name      string
	published int
	effects   int // published messages with an effect
	doubles   int // effects beyond the first, over all messages
	losses    int // published messages without an effect
	counts    map[string]int
	problems  []string
}

func (r *result) count(what string, n int) {
	if r.counts == nil {
		r.counts = map[string]int{}
	}
	r.counts[what] += n
}

// problem records a violation of the guarantee (the first 20 in detail).
func (r *result) problem(format string, args ...any) {
	r.count("violations", 1)
	if len(r.problems) < 20 {
		r.problems = append(r.problems, fmt.Sprintf(format, args...))
	}
}

// effects adds the counting effect's verdict: n holds the effects counted
// per message ID.
func (r *result) effectCounts(ids []string, n map[string]int) {
	published := map[string]bool{}
	for _, id := range ids {
		published[id] = true
		switch c := n[id]; {
		case c == 0:
			r.losses++
			r.problem("%s: no effect", id)
		case c > 1:
			r.effects++
			r.doubles += c - 1
			r.problem("%s: effect ran %d times", id, c)
		default:
			r.effects++
		}
	}
	for id := range n {
		if !published[id] {
			r.problem("%s: an effect for a message never published", id)
		}
	}
}

func (r *result) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-13s published %d, effects %d, doubles %d, losses %d", r.name, r.published, r.effects, r.doubles, r.losses)
	for _, k := range slices.Sorted(mapKeys(r.counts)) {
		fmt.Fprintf(&b, ", %s %d", k, r.counts[k])
	}
	return b.String()
}

func mapKeys[M ~map[K]V, K comparable, V any](m M) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// TestSoak runs the pipelines at once under load while the scheduler
// injects faults, then drains and checks the history (see the package
// doc). Reproduce a run's schedule with
//
//	go test ./internal/soaktest -run TestSoak -soak.seed=N -soak.duration=D
func TestSoak(t *testing.T) {
	t.Parallel() // the tests of this module overlap: the soak spends most of its time waiting
	seed := *soakSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("soak: seed %d, duration %v, %d messages/s per pipeline", seed, *soakDuration, *soakRate)
	dir := t.TempDir()
	setup := time.Now()
	// cmd/idem builds while the servers start.
	var bin string
	var buildErr error
	built := make(chan struct{})
	go func() { defer close(built); bin, buildErr = buildIdem(dir) }()
	svc := startServers(t, "postgres-durable", "nats", "mariadb", "rabbitmq")
	<-built
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	rmq := &rabbit{svc: svc["rabbitmq"]}
	rmq.proxy, rmq.proxiedURL = faultproxy.URL(t, rmq.svc.URL)
	pgn := startPGNATS(t, svc["postgres-durable"], svc["nats"])
	my := startMariaDBAMQP(t, svc["mariadb"], rmq)
	pipes := []pipeline{pgn, startSQLiteKafka(t, dir), startRedisLease(t), my,
		startPGSQLGoCDK(t, pgn, rmq), startSidecar(t, bin, pgn, my)}
	t.Logf("soak: servers started in %v", time.Since(setup).Round(time.Millisecond))
	// Each pipeline has members consumers in its group, each a process.
	procs := map[string][]*proc{}
	var logs []string
	mem, err := startMemoryClock()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mem.close)
	pipes = append(pipes, mem)
	for _, p := range pipes {
		if _, ok := p.(local); ok {
			continue
		}
		for m := range members {
			log := filepath.Join(dir, fmt.Sprintf("%s-%c.log", p.name(), 'a'+m))
			logs = append(logs, log)
			procs[p.name()] = append(procs[p.name()], startProc(t, p.name(), p.env(), log))
		}
	}
	var faults []fault
	for _, p := range pipes {
		faults = append(faults, p.faults()...)
		prs := procs[p.name()]
		if len(prs) == 0 {
			continue
		}
		faults = append(faults, fault{kind: "kill consumer " + p.name(), do: func(rng *rand.Rand) (string, error) {
			m := rng.IntN(len(prs))
			what, err := prs[m].kill()
			return fmt.Sprintf("member %c, %s", 'a'+m, what), err
		}})
	}

	// Load: each pipeline's producer publishes at the rate until stop;
	// a message it started is published until the broker takes it.
	stop := make(chan struct{})
	ids := make([][]string, len(pipes))
	var wg sync.WaitGroup
	for i, p := range pipes {
		wg.Go(func() { ids[i] = produce(p, stop, *soakRate) })
	}

	log := runSchedule(t, seed, *soakDuration, faults)
	restartTimes, restartErrs := restarts.wait()
	for _, err := range restartErrs {
		t.Error(err)
	}
	close(stop)
	wg.Wait()

	// Drain: no fault is running any more (each fault ends before the
	// next one starts and the last one has ended).
	ctx := context.Background()
	deadline := time.Now().Add(drainTimeout)
	drainStart := time.Now()
	lastWhy := drainStart
	pending := slices.Clone(pipes)
	for len(pending) > 0 {
		var whys []string
		pending = slices.DeleteFunc(pending, func(p pipeline) bool {
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			ok, why := p.drained(pctx, ids[slices.Index(pipes, p)])
			cancel()
			if !ok {
				whys = append(whys, p.name()+": "+why)
			}
			return ok
		})
		if len(pending) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("not drained %v after the faults stopped: %s", drainTimeout, strings.Join(whys, "; "))
			break
		}
		if time.Since(lastWhy) >= 30*time.Second {
			t.Logf("soak: draining for %v: %s", time.Since(drainStart).Round(time.Second), strings.Join(whys, "; "))
			lastWhy = time.Now()
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("soak: drained in %v", time.Since(drainStart).Round(time.Millisecond))
	var results []*result
	for _, prs := range procs {
		for _, p := range prs {
			p.stop()
		}
	}
	failed := t.Failed()
	for i, p := range pipes {
		r := &result{name: p.name(), published: len(ids[i])}
		p.check(ctx, ids[i], r)
		for m, pr := range procs[p.name()] {
			r.count("consumer starts", pr.starts)
			for _, c := range pr.crashes {
				r.problem("consumer process %c: %s", 'a'+m, c)
			}
		}
		results = append(results, r)
		if len(r.problems) > 0 {
			failed = true
		}
	}
	byKind := map[string]int{}
	for _, e := range log {
		byKind[e.kind]++
	}
	var summary strings.Builder
	fmt.Fprintf(&summary, "soak: seed %d, %v, %d faults:", seed, *soakDuration, len(log))
	for _, k := range slices.Sorted(mapKeys(byKind)) {
		fmt.Fprintf(&summary, "\n  %4d  %s", byKind[k], k)
	}
	for _, name := range slices.Sorted(mapKeys(restartTimes)) {
		ts := slices.Sorted(slices.Values(restartTimes[name]))
		fmt.Fprintf(&summary, "\n  %s restarted %d times in %v (%v–%v)", name, len(ts),
			ts[len(ts)/2].Round(time.Millisecond), ts[0].Round(time.Millisecond), ts[len(ts)-1].Round(time.Millisecond))
	}
	for _, r := range results {
		fmt.Fprintf(&summary, "\n  %s", r)
	}
	var faultLog strings.Builder
	for _, e := range log {
		fmt.Fprintf(&faultLog, "\n  %9s  %s: %s", e.at.Round(time.Millisecond), e.kind, e.detail)
	}
	if !failed {
		t.Logf("%s\nfault log:%s", summary.String(), faultLog.String())
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "soak FAILED; reproduce the schedule with -soak.seed=%d -soak.duration=%v\n%s\nfault log:%s",
		seed, *soakDuration, summary.String(), faultLog.String())
	for _, r := range results {
		for _, p := range r.problems {
			fmt.Fprintf(&b, "\n  %s: %s", r.name, p)
		}
	}
	t.Error(b.String())
	for _, log := range logs {
		if b, err := os.ReadFile(log); err == nil {
			t.Logf("consumer log %s (last 4KB):\n%s", filepath.Base(log), tail(b, 4096))
		}
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// logEntry is one injected fault.
type logEntry struct {
	at     time.Duration // since the schedule started
	kind   string
	detail string
}

// runSchedule injects faults for d, one at a time, each after a wait and
// of a kind drawn from seed's random source, and returns what it did. A
// fault that fails to inject (a server that does not restart) fails the
// test.
func runSchedule(t *testing.T, seed uint64, d time.Duration, faults []fault) []logEntry {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var log []logEntry
	start := time.Now()
	for {
		wait := time.Duration(300+rng.IntN(2200)) * time.Millisecond
		if time.Since(start)+wait >= d {
			time.Sleep(max(0, d-time.Since(start)))
			return log
		}
		time.Sleep(wait)
		f := faults[rng.IntN(len(faults))]
		at := time.Since(start)
		detail, err := f.do(rng)
		if err != nil {
			t.Errorf("fault %q at %v: %v", f.kind, at, err)
			detail = "FAILED: " + err.Error()
		}
		log = append(log, logEntry{at: at, kind: f.kind, detail: detail})
	}
}

// produce publishes messages <name>-000001, ... at rate per second until
// stop is closed, and returns the IDs the broker took.
func produce(p pipeline, stop <-chan struct{}, rate int) []string {
	var ids []string
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := 1; ; i++ {
		select {
		case <-stop:
			return ids
		case <-tick.C:
		}
		id := fmt.Sprintf("%s-%06d", p.name(), i)
		payload := []byte(fmt.Sprintf("k%d", i%orderKeys))
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := p.publish(ctx, id, payload)
			cancel()
			if err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		ids = append(ids, id)
	}
}

// proc is a consumer process, supervised: started again at once when the
// scheduler kills it, and after a pause when it could not reach its
// servers; any other exit is a crash, which fails the soak.
type proc struct {
	role    string
	env     []string
	logFile *os.File
	done    chan struct{}

	mu      sync.Mutex
	cmd     *exec.Cmd
	killed  bool
	stopped bool
	starts  int
	setups  int // failed set-ups in a row
	crashes []string
}

// maxSetups is how many failed set-ups in a row (0.2s apart) make a crash.
const maxSetups = 150

func startProc(t *testing.T, role string, env []string, logPath string) *proc {
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{role: role, env: env, logFile: f, done: make(chan struct{})}
	started := make(chan struct{})
	go p.supervise(started)
	<-started
	t.Cleanup(func() { p.stop(); f.Close() })
	return p
}

func (p *proc) supervise(started chan struct{}) {
	defer close(p.done)
	for first := true; ; first = false {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(append(os.Environ(), roleEnv+"="+p.role), p.env...)
		cmd.Stdout, cmd.Stderr = p.logFile, p.logFile
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		p.mu.Lock()
		if p.stopped {
			p.mu.Unlock()
			return
		}
		err := cmd.Start()
		if err == nil {
			p.cmd = cmd
			p.starts++
		}
		p.mu.Unlock()
		if first {
			close(started)
		}
		if err != nil {
			p.mu.Lock()
			p.crashes = append(p.crashes, fmt.Sprintf("start: %v", err))
			p.mu.Unlock()
			time.Sleep(time.Second)
			continue
		}
		err = cmd.Wait()
		p.mu.Lock()
		stopped, killed := p.stopped, p.killed
		p.killed = false
		code := cmd.ProcessState.ExitCode()
		if code == exitSetup {
			p.setups++
		} else {
			p.setups = 0
		}
		switch {
		case stopped || killed:
		case code != exitSetup && code != exitReconnect:
			p.crashes = append(p.crashes, fmt.Sprintf("exited by itself: %v", err))
		case p.setups == maxSetups:
			p.crashes = append(p.crashes, fmt.Sprintf("failed to set up %d times in a row", p.setups))
		}
		p.mu.Unlock()
		if stopped {
			return
		}
		if !killed {
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// kill sends SIGKILL to the running process; the supervisor starts
// another.
func (p *proc) kill() (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return "not running", nil
	}
	p.killed = true
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		p.killed = false
		return "already gone", nil
	}
	return fmt.Sprintf("pid %d", p.cmd.Process.Pid), nil
}

// stop kills the process for good and waits for the supervisor.
func (p *proc) stop() {
	p.mu.Lock()
	p.stopped = true
	if p.cmd != nil {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	}
	p.mu.Unlock()
	<-p.done
}

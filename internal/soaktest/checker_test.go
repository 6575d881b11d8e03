package soaktest

import (
	"context"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testenv"
)

// TestCheckerCatchesBrokenConsumer runs the sqlite-kafka pipeline with a
// consumer broken on purpose (it acknowledges a message before its
// effect, which runs a second later) and kills its processes while
// messages flow: the soak's checker must report the messages acknowledged
// and never processed as losses. It needs no root (SQLite and kfake run
// here) and takes about 20 seconds.
func TestCheckerCatchesBrokenConsumer(t *testing.T) {
	t.Parallel() // the tests of this module overlap: the soak spends most of its time waiting
	dir := t.TempDir()
	p := startSQLiteKafka(t, dir)
	env := append(p.env(), brokenEnv+"=ack-first")
	var procs []*proc
	for m := range members {
		procs = append(procs, startProc(t, p.name(), env, filepath.Join(dir, p.name()+"-"+string(rune('a'+m))+".log")))
	}
	effects := func() int {
		var n int
		if err := p.db.QueryRowContext(t.Context(), `SELECT count(*) FROM soak_effects`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// progress waits until effects grow past n, and returns them. After a
	// kill the group waits for the dead member's session to end and
	// rebalances, which took more than 30s once under load.
	progress := func(n int) int {
		for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if e := effects(); e > n {
				return e
			}
		}
		t.Fatalf("no effect beyond %d in 2m", n)
		return 0
	}

	stop := make(chan struct{})
	var ids []string
	var wg sync.WaitGroup
	wg.Go(func() { ids = produce(p, stop, *soakRate) })
	// Three kills, each once effects are being made (so that some
	// messages are acknowledged and waiting for their effect).
	n := 0
	for k := range 3 {
		n = progress(n)
		time.Sleep(300 * time.Millisecond)
		if _, err := procs[k%members].kill(); err != nil {
			t.Fatal(err)
		}
	}
	progress(n)
	close(stop)
	wg.Wait()
	// Let what is left settle: effects that stopped growing for 3s.
	for last, since := effects(), time.Now(); time.Since(since) < 3*time.Second; time.Sleep(100 * time.Millisecond) {
		if e := effects(); e != last {
			last, since = e, time.Now()
		}
	}
	for _, pr := range procs {
		pr.stop()
	}
	r := &result{name: p.name(), published: len(ids)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p.check(ctx, ids, r)
	t.Logf("broken consumer: %s", r)
	if r.losses == 0 || r.counts["violations"] == 0 {
		t.Errorf("the checker reported no loss for a consumer that acknowledges before its effect: %s", r)
	}
}

// TestMemoryClockJumps runs the memory-clock pipeline alone for a few
// seconds with its clock jumped forward past the lease every half second
// (needs no server): every message has its effect once, and no holder
// whose lease the jump ended completes after the one that took over. The
// takeovers are counted by the tokens the provider saw; the test needs
// some, or the jumps tested nothing.
func TestMemoryClockJumps(t *testing.T) {
	t.Parallel() // the tests of this module overlap: the soak spends most of its time waiting
	p, err := startMemoryClock()
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	stop := make(chan struct{})
	var ids []string
	var wg sync.WaitGroup
	wg.Go(func() { ids = produce(p, stop, 40) })
	jump := p.faults()[0]
	rng := rand.New(rand.NewPCG(1, 2))
	for range 10 {
		time.Sleep(500 * time.Millisecond)
		if _, err := jump.do(rng); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	testenv.Eventually(t, time.Minute, "every message settled", func() bool { ok, _ := p.drained(t.Context(), ids); return ok },
		func() string { _, why := p.drained(t.Context(), ids); return why })
	r := &result{name: p.name(), published: len(ids)}
	p.check(t.Context(), ids, r)
	_, _, maxToken := p.provider.snapshot()
	takeovers := 0
	for _, tok := range maxToken {
		if tok > 1 {
			takeovers++
		}
	}
	t.Logf("%s, messages taken over %d", r, takeovers)
	if len(r.problems) > 0 {
		t.Errorf("violations: %v", r.problems)
	}
	if takeovers == 0 {
		t.Error("no lease was taken over after a clock jump")
	}
}

// TestInDir: the PostgreSQL kill finds the server's processes by their
// working directory, the data directory.
func TestInDir(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command("sleep", "60")
	cmd.Dir = dir
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if pids := inDir(dir); !slices.Equal(pids, []int{cmd.Process.Pid}) {
		t.Errorf("inDir(%s) = %v, want [%d]", dir, pids, cmd.Process.Pid)
	}
}

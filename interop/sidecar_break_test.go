package interop

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/faultproxy"
	"github.com/idem-go/idem/internal/testenv"
)

// checkAtMostOnce checks the service's counts after n messages msg-000000
// ... delivered at most once: no message reached the service twice (a
// request cut short counts), every message either executed or
// dead-lettered, and no dead letter of a reason other than
// outcome-unknown. It returns the executed and dead-lettered counts.
func checkAtMostOnce(t *testing.T, c counts, n int) (executed, unknown int) {
	t.Helper()
	for i := range n {
		id := fmt.Sprintf("msg-%06d", i)
		if a := c.Arrivals[id]; a > 1 {
			t.Errorf("%s reached the service %d times at most once", id, a)
		}
		if e := c.Execs[id]; e > 1 {
			t.Errorf("%s executed %d times", id, e)
		}
		for _, r := range c.Dead[id] {
			if r != "outcome-unknown" {
				t.Errorf("%s dead-lettered with reason %q", id, r)
			}
		}
		switch {
		case len(c.Dead[id]) > 0:
			unknown++
		case c.Execs[id] == 1:
			executed++
		default:
			t.Errorf("%s lost: never executed, not dead-lettered", id)
		}
	}
	return executed, unknown
}

// awaitSettled waits until the service executed or received as a dead
// letter n messages, each counted once: a message executed and then
// dead-lettered as outcome-unknown (its answer lost) is one, not two.
func awaitSettled(t *testing.T, svc *pyService, n int) {
	t.Helper()
	var c counts
	settled := func() int {
		k := len(c.Execs)
		for id := range c.Dead {
			if c.Execs[id] == 0 {
				k++
			}
		}
		return k
	}
	testenv.Eventually(t, 3*time.Minute, "every message executed or dead-lettered", func() bool {
		c = svc.counts(t)
		return settled() >= n
	}, func() string {
		return fmt.Sprintf("%d settled: %d executed, %d dead letters", settled(), len(c.Execs), len(c.Dead))
	})
}

// TestSidecarStoppedNotDoubled stops a sidecar (SIGSTOP) mid-run, long
// enough for its leases and its broker holds to run out, starts another
// on the same store and consumer, and resumes the first (SIGCONT) while
// the second works: the stopped one, fenced, must not call the service
// for a message the second took over, and nothing is lost.
func TestSidecarStoppedNotDoubled(t *testing.T) {
	// Not on SQLite: a sidecar stopped inside a write transaction keeps
	// the file's write lock, and the other waits for its return.
	for _, tc := range []struct{ broker, store string }{{"nats", "redis"}, {"redis", "redis"}} {
		t.Run(tc.broker+"-"+tc.store, func(t *testing.T) { testSidecarStopped(t, tc.broker, tc.store) })
	}
}

func testSidecarStopped(t *testing.T, broker, st string) {
	const n = 240
	dir := t.TempDir()
	brokerURL := testenv.URL(t, testenv.NATSEnv, "nats://127.0.0.1:4222")
	from, dead := "sidecar."+uniq()+".in", ""
	if broker == "redis" {
		brokerURL = testenv.URL(t, testenv.RedisEnv, "redis://127.0.0.1:6379/0")
		from = "idem-sidecar:" + uniq()
		dead = from + "-dead"
	} else {
		dead = from + ".dead"
	}
	store := filepath.Join(dir, "main.db")
	svc := startPyService(t, dir, store, "main", 1000)
	runIdem(t, "publish", "--broker", brokerURL, "--to", from, "--count", fmt.Sprint(n), "--concurrency", "16")

	storeURL := "sqlite:" + store
	if st == "redis" {
		storeURL = testenv.URL(t, testenv.RedisEnv, "redis://127.0.0.1:6379/0")
	}
	args := []string{"--broker", brokerURL, "--from", from, "--to", svc.url + "/in", "--store", storeURL,
		"--consumer", "main-" + uniq(), "--group", "main", "--concurrency", "8", "--retry-base", "100ms"}
	reader := startSidecar(t, filepath.Join(dir, "dead.log"), "--broker", brokerURL, "--from", dead,
		"--to", svc.url+"/dead", "--store", "sqlite:"+filepath.Join(dir, "dead.db"), "--consumer", "dead-reader", "--group", "dead-reader")
	logA, logB := filepath.Join(dir, "a.log"), filepath.Join(dir, "b.log")
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range []string{logA, logB} {
				b, _ := os.ReadFile(p)
				t.Logf("%s:\n%s", filepath.Base(p), b)
			}
		}
	})
	a := startSidecar(t, logA, args...)
	testenv.Eventually(t, 2*time.Minute, "50 messages executed", func() bool { return len(svc.counts(t).Execs) >= 50 }, nil)
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := len(svc.counts(t).Execs)
	stoppedAt := time.Now()
	b := startSidecar(t, logB, args...)
	// The second sidecar works on, and the first stays stopped for
	// longer than its leases (3s) and its broker holds (3s): what it
	// held has been taken over.
	var c counts
	testenv.Eventually(t, time.Minute, "the second sidecar executes", func() bool {
		c = svc.counts(t)
		return len(c.Execs) >= stopped+40 && time.Since(stoppedAt) > 10*time.Second
	}, func() string {
		return fmt.Sprintf("%d executed when the first was stopped, %d now, %d requests", stopped, len(c.Execs), c.Requests)
	})
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	awaitSettled(t, svc, n)
	a.stop(t)
	b.stop(t)
	reader.stop(t)
	c = svc.counts(t)
	once, unknown := checkAtMostOnce(t, c, n)
	t.Logf("%d messages, SIGSTOP/SIGCONT of the first sidecar: %d executed once, %d dead-lettered outcome-unknown, %d requests",
		n, once, unknown, c.Requests)
}

// TestSidecarStoreStall delivers messages through `idem consume` whose
// Redis store's connections stall (every answer held back 1.5s or 5s;
// or the connections open black-holed for good) while calls run, while a
// service call outlasts the lease, and with --hold 256: at most once, no
// message reaches the service twice and none is lost; a stall shorter
// than the lease costs no message.
func TestSidecarStoreStall(t *testing.T) {
	for _, tc := range []struct {
		name    string
		stall   time.Duration
		delayMS int
		hold    string
		n       int // messages; 200 when 0
		// blackHole stalls the connections open at the stall for good
		// (faultproxy.Stall) instead of slowing every answer.
		blackHole bool
	}{
		{"stall-1.5s", 1500 * time.Millisecond, 200, "16", 0, false},
		{"stall-5s", 5 * time.Second, 200, "16", 0, false},
		{"slow-service-stall-1.5s", 1500 * time.Millisecond, 4000, "16", 64, false},
		{"hold-256-stall-5s", 5 * time.Second, 200, "256", 0, false},
		{"black-hole", 0, 200, "16", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := tc.n
			if n == 0 {
				n = 200
			}
			dir := t.TempDir()
			brokerURL := testenv.URL(t, testenv.NATSEnv, "nats://127.0.0.1:4222")
			proxy, storeURL := faultproxy.URL(t, testenv.URL(t, testenv.RedisEnv, "redis://127.0.0.1:6379/0"))
			from := "sidecar." + uniq() + ".in"
			consumer := "stall-" + uniq()
			svc := startPyService(t, dir, filepath.Join(dir, "none.db"), consumer, tc.delayMS)
			runIdem(t, "publish", "--broker", brokerURL, "--to", from, "--count", fmt.Sprint(n), "--concurrency", "16")
			logPath := filepath.Join(dir, "consume.log")
			t.Cleanup(func() {
				if t.Failed() {
					b, _ := os.ReadFile(logPath)
					t.Logf("idem consume output:\n%s", b)
				}
			})
			reader := startSidecar(t, filepath.Join(dir, "dead.log"), "--broker", brokerURL, "--from", from+".dead",
				"--to", svc.url+"/dead", "--store", "sqlite:"+filepath.Join(dir, "dead.db"), "--consumer", "dead-reader", "--group", "dead-reader")
			p := startSidecar(t, logPath, "--broker", brokerURL, "--from", from, "--to", svc.url+"/in", "--store", storeURL,
				"--consumer", consumer, "--group", consumer, "--concurrency", "16", "--hold", tc.hold, "--retry-base", "100ms")
			testenv.Eventually(t, 2*time.Minute, "calls running", func() bool {
				c := svc.counts(t)
				return len(c.Arrivals) >= 30
			}, nil)
			if tc.blackHole {
				if proxy.Stall() == 0 {
					t.Fatal("no store connection to stall")
				}
			} else {
				proxy.Slow(tc.stall)
				time.Sleep(tc.stall) // the stall's length is the test's point, not a synchronisation
				proxy.Slow(0)
			}
			awaitSettled(t, svc, n)
			p.stop(t)
			reader.stop(t)
			c := svc.counts(t)
			once, unknown := checkAtMostOnce(t, c, n)
			t.Logf("%s: %d messages: %d executed once, %d dead-lettered outcome-unknown, %d requests",
				tc.name, n, once, unknown, c.Requests)
			if !tc.blackHole && tc.stall < 3*time.Second && unknown > 0 {
				b, _ := os.ReadFile(logPath)
				t.Errorf("a %v store stall, shorter than the 3s lease, dead-lettered %d messages; log has %d lines",
					tc.stall, unknown, strings.Count(string(b), "\n"))
			}
		})
	}
}

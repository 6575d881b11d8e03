package interop

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testenv"
)

// TestSidecarRecovery SIGKILLs `idem consume`, with its default --lease and
// --ack-wait, while every call it made is still running at a slow Python
// service, restarts it at once, and measures the time from the restart to
// the last message in flight at the kill taken up again: called again
// (at least once) or settled as outcome-unknown (at most once, the
// default, also with --hold above --concurrency and --point-at-call,
// where messages wait claimed for a call, with no recovery point). It logs that time (measured, not asserted: the
// machine may be loaded) and checks the outcome: at most once, no message
// is called twice, none is lost, and no more are dead-lettered as
// outcome-unknown than calls may have started (a message that waited
// claimed is sent after the restart); at least once, every message is
// executed, and only the ones whose call the kill cut short are executed
// twice. On
// Kafka the sidecar is a static member (--kafka-instance-id), as the
// help advises for a quick restart.
func TestSidecarRecovery(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Fatal("python3 is needed for the sidecar test")
	}
	// n messages, each taking the service delayMS: the kill comes while
	// the first calls run, so every message held is in flight.
	const n, delayMS, concurrency = 24, 1500, 8
	modes := []struct {
		name        string
		args        []string
		atLeastOnce bool
		natsOnly    bool // --batch-claim is for a nats:// broker
	}{
		{"at-most-once", nil, false, false},
		// Claimed ahead: 8 calls run, 16 messages wait claimed, without
		// a recovery point until their call (--point-at-call).
		{"at-most-once-hold", []string{"--hold", fmt.Sprint(n), "--point-at-call"}, false, false},
		{"at-least-once", []string{"--at-least-once"}, true, false},
		// The batches a pull request hands over, claimed in one store
		// call and completed in one (--batch-claim): the same outcomes.
		{"batch-claim", []string{"--batch-claim"}, false, true},
		{"batch-claim-hold", []string{"--batch-claim", "--hold", fmt.Sprint(n), "--point-at-call"}, false, true},
		{"batch-claim-at-least-once", []string{"--batch-claim", "--at-least-once"}, true, true},
	}
	for _, bc := range sidecarBrokers() {
		for _, m := range modes {
			if m.natsOnly && bc.name != "nats" {
				continue
			}
			atLeastOnce, mode := m.atLeastOnce, m.name
			t.Run(bc.name+"/"+mode, func(t *testing.T) {
				dir := t.TempDir()
				brokerURL, from := bc.open(t)
				store := filepath.Join(dir, "main.db")
				svc := startPyService(t, dir, store, "main", delayMS)
				runIdem(t, "publish", "--broker", brokerURL, "--to", from, "--count", fmt.Sprint(n),
					"--nats-duplicates", "100ms", "--concurrency", "8")
				args := []string{"--broker", brokerURL, "--from", from, "--to", svc.url + "/in", "--store", "sqlite:" + store,
					"--consumer", "main", "--group", "main", "--concurrency", fmt.Sprint(concurrency), "--retry-base", "100ms",
					"--retry-delay", "200ms", "--nats-duplicates", "100ms"}
				if slices.Contains(bc.extra, "--batch-claim") {
					// The broker's batch mode is recovered from too; its
					// other flags (Kafka key order, --hold) are the kill
					// test's only.
					args = append(args, "--batch-claim")
				}
				args = append(args, m.args...)
				if bc.name == "kafka" {
					args = append(args, "--kafka-instance-id", "recovery-"+uniq())
				}
				logPath := filepath.Join(dir, "consume.log")
				t.Cleanup(func() {
					if t.Failed() {
						b, _ := os.ReadFile(logPath)
						t.Logf("idem consume output:\n%s", b)
					}
				})
				p := startSidecar(t, logPath, args...)
				// Kafka runs one call per partition (4 here), the others
				// up to --concurrency (8).
				testenv.Eventually(t, 2*time.Minute, "4 calls running", func() bool {
					return len(svc.counts(t).Arrivals) >= 4
				}, nil)
				p.kill()
				// The calls after the kill take no time: what is measured
				// is the recovery, not the service's queue.
				svc.noDelay(t)
				// What the dead sidecar left: its records not completed
				// are the messages it held.
				c0 := svc.counts(t)
				p = startSidecar(t, logPath, args...)
				restart := time.Now()
				inFlight := map[string]bool{}
				for id, r := range c0.Records {
					if state, _ := r[0].(float64); state != 2 {
						inFlight[id] = true
					}
				}
				if len(inFlight) == 0 {
					t.Fatalf("no message in flight at the kill: %d records, %d arrivals", len(c0.Records), len(c0.Arrivals))
				}
				// takenUp: each in-flight message, called again or
				// settled by the restarted sidecar, and when.
				takenUp := map[string]time.Duration{}
				var c counts
				testenv.Eventually(t, 2*time.Minute, "every message in flight at the kill taken up again", func() bool {
					c = svc.counts(t)
					now := time.Since(restart)
					for id := range inFlight {
						if _, ok := takenUp[id]; ok {
							continue
						}
						state, _ := c.Records[id][0].(float64)
						if c.Arrivals[id] > c0.Arrivals[id] || state == 2 {
							takenUp[id] = now
						}
					}
					return len(takenUp) == len(inFlight)
				}, func() string { return fmt.Sprintf("%d of %d taken up", len(takenUp), len(inFlight)) })
				var last time.Duration
				for _, d := range takenUp {
					last = max(last, d)
				}

				testenv.Eventually(t, 3*time.Minute, "every message settled", func() bool {
					c = svc.counts(t)
					if len(c.Records) < n {
						return false
					}
					for id, r := range c.Records {
						state, _ := r[0].(float64)
						unknown, _ := r[1].(bool)
						if state != 2 || (!unknown && c.Execs[id] == 0) {
							return false // completed, its execution not yet counted
						}
					}
					return true
				}, func() string { return fmt.Sprintf("%d records, %d executed", len(c.Records), len(c.Execs)) })
				p.stop(t)
				c = svc.counts(t)

				var twice, unknown []string
				for i := range n {
					id := fmt.Sprintf("msg-%06d", i)
					e := c.Execs[id]
					unk, _ := c.Records[id][1].(bool)
					calledBeforeKill := c0.Arrivals[id] > 0
					switch {
					case unk && atLeastOnce:
						t.Errorf("%s: outcome unknown at least once", id)
					case unk && !inFlight[id]:
						t.Errorf("%s: outcome unknown, but completed before the kill", id)
					case unk:
						unknown = append(unknown, id)
						if e > 1 {
							t.Errorf("%s: outcome unknown, executed %d times", id, e)
						}
					case e == 0:
						t.Errorf("%s lost: never executed, not outcome-unknown", id)
					case e == 2 && atLeastOnce && calledBeforeKill:
						twice = append(twice, id) // its call was cut short: sent again
					case e > 1:
						t.Errorf("%s executed %d times (called before the kill: %v)", id, e, calledBeforeKill)
					}
				}
				// At most once, only a message whose call may have started
				// is dead-lettered as outcome-unknown; one claimed and
				// waiting is sent. While no call has ended (none executed
				// at the kill), at most --concurrency calls have started.
				if len(c0.Execs) == 0 && len(unknown) > concurrency {
					t.Errorf("%d messages dead-lettered as outcome-unknown, more than the %d calls that may have started", len(unknown), concurrency)
				}
				sort.Strings(unknown)
				t.Logf("%s %s: restart to the last of %d messages in flight taken up again: %v (default --lease and --ack-wait); %d called twice (cut short by the kill), %d outcome-unknown: %s",
					bc.name, mode, len(inFlight), last.Round(time.Millisecond), len(twice), len(unknown), strings.Join(unknown, " "))
			})
		}
	}
}

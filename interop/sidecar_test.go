package interop

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idem-go/idem/internal/testenv"
)

// sidecarBroker is a broker of the sidecar kill test: its --broker URL and
// the names of this run's source (its dead letter is the sidecar's
// default, and the dead-letter reader's dead letter the default of that).
type sidecarBroker struct {
	name string
	// open returns the --broker URL and the source name.
	open func(t *testing.T) (url, from string)
	// ackWait is --ack-wait: how soon a killed sidecar's deliveries come back.
	ackWait string
	// extra are flags of the main sidecar only.
	extra []string
}

func sidecarBrokers() []sidecarBroker {
	openKafka := func(t *testing.T) (string, string) {
		from := "sidecar-" + uniq()
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, from, from+"-dead", from+"-dead-dead"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return "kafka://" + strings.Join(c.ListenAddrs(), ","), from
	}
	return []sidecarBroker{
		{"nats", func(t *testing.T) (string, string) {
			return testenv.URL(t, testenv.NATSEnv, "nats://127.0.0.1:4222"), "sidecar." + uniq() + ".in"
		}, "3s", nil},
		{"kafka", openKafka, "6s", nil},
		// Records of one partition with different keys at once (idem
		// publish keys each record by its ID), up to --hold.
		{"kafka-key-order", openKafka, "6s", []string{"--kafka-order", "key", "--hold", "32"}},
		// Each polled batch of a partition claimed in one store call
		// and completed in one, its records called in offset order.
		{"kafka-batch-claim", openKafka, "6s", []string{"--batch-claim", "--hold", "32"}},
		{"rabbitmq", func(t *testing.T) (string, string) {
			return testenv.URL(t, testenv.AMQPEnv, "amqp://guest:guest@127.0.0.1:5672/"), "sidecar-" + uniq()
		}, "3s", nil},
		{"redis", openRedis, "3s", nil},
		// Each XREADGROUP's (or XAUTOCLAIM's) entries claimed in one
		// store call and completed in one more (Redis Streams batch
		// mode).
		{"redis-batch-claim", openRedis, "3s", []string{"--batch-claim"}},
	}
}

// openRedis returns the --broker URL of the test Redis and a new stream.
func openRedis(t *testing.T) (string, string) {
	return testenv.URL(t, testenv.RedisEnv, "redis://127.0.0.1:6379/0"), "idem-sidecar:" + uniq()
}

// pyService is the Python service of testdata/sidecar_service.py.
type pyService struct {
	url string
}

// counts is the service's GET /counts.
type counts struct {
	Execs    map[string]int      `json:"execs"`
	Dead     map[string][]string `json:"dead"`
	Requests int                 `json:"requests"`
	Records  map[string][2]any   `json:"records"`
	Arrivals map[string]int      `json:"arrivals"` // POST /in requests received, cut short or not
}

func startPyService(t *testing.T, dir, store, consumer string, delayMS int) *pyService {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	cmd := exec.Command("python3", filepath.Join(filepath.Dir(file), "testdata", "sidecar_service.py"),
		filepath.Join(dir, "service.db"), fmt.Sprint(delayMS), store, consumer)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("python3: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	port, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("the Python service did not print its port: %v", err)
	}
	return &pyService{url: "http://127.0.0.1:" + strings.TrimSpace(port)}
}

// counts returns the service's counts; on a machine so loaded that the
// service does not answer within 30s, the empty counts (callers poll).
func (s *pyService) counts(t *testing.T) counts {
	t.Helper()
	var c counts
	client := &http.Client{Timeout: 30 * time.Second}
	resp, err := client.Get(s.url + "/counts")
	if err != nil {
		t.Logf("GET /counts: %v", err)
		return c
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
		t.Logf("GET /counts: %v", err)
		return counts{}
	}
	return c
}

// noDelay makes the service execute the requests that arrive from now on
// at once (POST /nodelay).
func (s *pyService) noDelay(t *testing.T) {
	t.Helper()
	resp, err := http.Post(s.url+"/nodelay", "text/plain", nil)
	if err != nil {
		t.Fatalf("POST /nodelay: %v", err)
	}
	resp.Body.Close()
}

// sidecarProc is a running `idem consume`.
type sidecarProc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func startSidecar(t *testing.T, logPath string, args ...string) *sidecarProc {
	t.Helper()
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(idemBin, append([]string{"consume"}, args...)...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &sidecarProc{cmd: cmd, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		log.Close()
		close(p.done)
	}()
	t.Cleanup(func() { p.kill() })
	return p
}

func (p *sidecarProc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// stop asks for a graceful stop (SIGTERM) and waits for it.
func (p *sidecarProc) stop(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		t.Errorf("idem consume did not stop within 60s of SIGTERM")
		p.kill()
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("idem consume exited with status %d after SIGTERM", code)
	}
}

func runIdem(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(idemBin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("idem %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestSidecarKill publishes 2,000 messages with 20% duplicates with `idem
// publish`, delivers them to a Python service with `idem consume`, which
// is SIGKILLed twice mid-run and restarted, and checks what the service
// executed: every message exactly once, except those dead-lettered with
// reason outcome-unknown (executed at most once), and none lost. A second
// `idem consume` reads the dead letters into the service.
func TestSidecarKill(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Fatal("python3 is needed for the sidecar test")
	}
	const n = 2000
	for _, bc := range sidecarBrokers() {
		t.Run(bc.name, func(t *testing.T) {
			dir := t.TempDir()
			brokerURL, from := bc.open(t)
			sep := "-"
			if bc.name == "nats" {
				sep = "."
			}
			dead := from + sep + "dead"
			mainStore := filepath.Join(dir, "main.db")
			svc := startPyService(t, dir, mainStore, "main", 3)

			out := runIdem(t, "publish", "--broker", brokerURL, "--to", from, "--count", fmt.Sprint(n),
				"--duplicates", "0.2", "--nats-duplicates", "100ms", "--concurrency", "16")
			t.Log(strings.TrimSpace(out))

			common := []string{"--broker", brokerURL, "--lease", "2s", "--ack-wait", bc.ackWait,
				"--retry-base", "100ms", "--retry-delay", "200ms", "--nats-duplicates", "100ms", "--concurrency", "8"}
			mainArgs := append([]string{"--from", from, "--to", svc.url + "/in", "--store", "sqlite:" + mainStore,
				"--consumer", "main", "--group", "main"}, append(common, bc.extra...)...)
			logPath := filepath.Join(dir, "consume.log")
			t.Cleanup(func() {
				if t.Failed() {
					b, _ := os.ReadFile(logPath)
					t.Logf("idem consume output:\n%s", b)
				}
			})
			reader := startSidecar(t, filepath.Join(dir, "dead.log"), append([]string{"--from", dead, "--to", svc.url + "/dead",
				"--store", "sqlite:" + filepath.Join(dir, "dead.db"), "--consumer", "dead-reader", "--group", "dead-reader"}, common...)...)

			executed := func() int { return len(svc.counts(t).Execs) }
			p := startSidecar(t, logPath, mainArgs...)
			for i, at := range []int{n / 4, n / 2} {
				testenv.Eventually(t, 2*time.Minute, fmt.Sprintf("%d messages executed before kill %d", at, i+1),
					func() bool { return executed() >= at }, nil)
				p.kill()
				p = startSidecar(t, logPath, mainArgs...)
			}

			// Done: every message has a completed record, and each
			// recorded as outcome-unknown has reached the service as a
			// dead letter.
			var c counts
			testenv.Eventually(t, 3*time.Minute, "every message settled", func() bool {
				c = svc.counts(t)
				if len(c.Records) < n {
					return false
				}
				for id, r := range c.Records {
					if state, _ := r[0].(float64); state != 2 {
						return false
					}
					if unknown, _ := r[1].(bool); unknown && len(c.Dead[id]) == 0 {
						return false
					}
				}
				return true
			}, func() string {
				return fmt.Sprintf("%d records, %d executed, %d dead letters", len(c.Records), len(c.Execs), len(c.Dead))
			})
			p.stop(t)
			reader.stop(t)
			testenv.Eventually(t, 2*time.Minute, "the final counts", func() bool {
				c = svc.counts(t)
				return len(c.Records) >= n
			}, nil)

			var once, unknown, unknownExecuted, lost int
			for i := range n {
				id := fmt.Sprintf("msg-%06d", i)
				e, reasons := c.Execs[id], c.Dead[id]
				for _, r := range reasons {
					if r != "outcome-unknown" {
						t.Errorf("%s dead-lettered with reason %q", id, r)
					}
				}
				switch {
				case e > 1:
					t.Errorf("%s executed %d times", id, e)
				case len(reasons) > 0:
					unknown++
					unknownExecuted += e
				case e == 1:
					once++
				default:
					lost++
					t.Errorf("%s lost: never executed, not dead-lettered", id)
				}
			}
			if len(c.Execs) > n || len(c.Dead) > n {
				t.Errorf("the service saw IDs that were not published: %d executed, %d dead", len(c.Execs), len(c.Dead))
			}
			t.Logf("%s: %d messages (2 SIGKILLs): %d executed exactly once, %d dead-lettered as outcome-unknown (%d of them executed once by the service, %d never), %d lost; %d service requests",
				bc.name, n, once, unknown, unknownExecuted, unknown-unknownExecuted, lost, c.Requests)
		})
	}
}

// TestSidecarRequiresFlags checks the command's usage errors.
func TestSidecarRequiresFlags(t *testing.T) {
	cmd := exec.CommandContext(context.Background(), idemBin, "consume", "--broker", "nats://127.0.0.1:1", "--from", "x", "--to", "ftp://x", "--store", "sqlite:/tmp/x.db")
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "--to") {
		t.Fatalf("bad --to: %v, %s; want exit status 2 naming --to", err, out)
	}
}

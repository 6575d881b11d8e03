//go:build !nodemo

package demo

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idem-go/idem/internal/ownservice"
	"github.com/idem-go/idem/internal/testenv"
)

// The kill tests run `idem demo` against a server of their own, started by
// scripts/services in a state directory and on ports of its own (never the
// shared one), kill -9 that server mid-run, start it again, and check the
// demo's JSON report: every payment charged once, none twice, none lost.

// TestDemoSurvivesRabbitMQKill kills -9 the RabbitMQ node mid-run. Its
// producer and members redial and declare the queues again; RabbitMQ
// requeues what was delivered and not acked, and keeps what it confirmed
// (persistent messages on durable queues).
func TestDemoSurvivesRabbitMQKill(t *testing.T) {
	t.Parallel()
	svc := ownservice.Start(t, "rabbitmq")
	testDemoSurvivesKill(t, ownFault(svc, "--broker"), 800)
}

// TestDemoSurvivesNATSKill kills -9 nats-server mid-run. The connections
// reconnect by themselves; the stream and the durable consumer are in the
// server's file store, which redelivers what was not acked.
func TestDemoSurvivesNATSKill(t *testing.T) {
	t.Parallel()
	svc := ownservice.Start(t, "nats")
	testDemoSurvivesKill(t, ownFault(svc, "--broker"), 800)
}

// TestDemoSurvivesPostgresKill kills -9 the postmaster of a PostgreSQL
// running with fsync and synchronous_commit on, the demo's store, mid-run:
// a commit it acknowledged survives crash recovery, one in flight is
// either there or rolled back, and the redelivery finds which.
func TestDemoSurvivesPostgresKill(t *testing.T) {
	t.Parallel()
	svc := ownservice.Start(t, "postgres-durable")
	db, err := sql.Open("pgx", svc.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, setting := range []string{"fsync", "synchronous_commit", "full_page_writes"} {
		var v string
		if err := db.QueryRowContext(t.Context(), "SHOW "+setting).Scan(&v); err != nil || v != "on" {
			t.Fatalf("%s = %q (%v), want on", setting, v, err)
		}
	}
	f := ownFault(svc, "--store")
	restart := f.restart
	f.restart = func(t *testing.T) {
		restart(t)
		// The restart replayed the WAL: the kill was a crash.
		b, _ := os.ReadFile(filepath.Join(svc.Dir, svc.Name, "postgres.log"))
		if !bytes.Contains(b, []byte("automatic recovery in progress")) {
			t.Errorf("no crash recovery in the server log:\n%s", b)
		}
	}
	testDemoSurvivesKill(t, f, 800)
}

// TestDemoSurvivesKafkaRestart stops a three-broker Kafka cluster
// (franz-go's kfake, persisting to a folder) mid-run and starts it again
// on the same folder and ports: the producer's and the members' clients
// reconnect by themselves, and records not committed are replayed.
func TestDemoSurvivesKafkaRestart(t *testing.T) {
	t.Parallel()
	ports, data := freePorts(t, 3), t.TempDir()
	open := func(t *testing.T) *kfake.Cluster {
		c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.Ports(ports...), kfake.DataDir(data),
			kfake.SeedTopics(8, kafkaTopic, kafkaDeadTopic, kafkaEventsTopic))
		if err != nil {
			t.Fatalf("kfake: %v", err)
		}
		return c
	}
	var mu sync.Mutex
	c := open(t)
	t.Cleanup(func() { mu.Lock(); c.Close(); mu.Unlock() })
	testDemoSurvivesKill(t, fault{
		what: "kafka (kfake) stop and start",
		args: []string{"--broker", "kafka://" + strings.Join(c.ListenAddrs(), ",")},
		kill: func(*testing.T) { mu.Lock(); c.Close(); mu.Unlock() },
		restart: func(t *testing.T) {
			next := open(t)
			mu.Lock()
			c = next
			mu.Unlock()
		},
	}, 800)
}

// fault is what a kill test does to a server: the demo's flags that point
// at it, how to kill it, and how to start it again.
type fault struct {
	what          string
	args          []string
	kill, restart func(t *testing.T)
}

func testDemoSurvivesKill(t *testing.T, f fault, messages int) {
	watch := &progressWatch{changed: make(chan struct{}, 1)}
	var stdout bytes.Buffer
	dir := t.TempDir()
	demoArgs := append([]string{"demo", "--json", "--progress", "lines", "--dir", dir,
		"--messages", strconv.Itoa(messages), "--consumers", "3", "--crash-rate", "0.01", "--ack-wait", "5s", "--timeout", "10m"},
		f.args...)
	code := make(chan int, 1)
	go func() { code <- runArgs(context.Background(), demoArgs, &stdout, watch) }()

	// Mid-run: the producer has published a quarter of the payments (it
	// records its progress every 100) and the consumers are charging.
	testenv.Eventually(t, 5*time.Minute, "a quarter of the payments published", func() bool {
		next, fresh := readProgress(filepath.Join(dir, "producer.next"))
		return !fresh && next >= messages/4
	}, watch.text)
	published, _ := readProgress(filepath.Join(dir, "producer.next"))
	killedAt := time.Now()
	f.kill(t)
	f.restart(t)
	backAt := time.Now()
	chargedAtBack := watch.charged()
	watch.await(t, chargedAtBack+1, 5*time.Minute)
	resumedAt := time.Now()

	var exit int
	select {
	case exit = <-code:
	case <-time.After(10 * time.Minute):
		t.Fatalf("the demo did not end; stderr:\n%s", watch.text())
	}
	var rep report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("exit %d, no JSON report (%v): stdout %q\nstderr:\n%s", exit, err, stdout.String(), watch.text())
	}
	if exit != 0 || rep.DoubleCharges != 0 || rep.Lost != 0 || rep.LedgerCharges != int64(messages) ||
		rep.ProviderCharges != int64(messages) || rep.DeadLettered != 0 {
		t.Errorf("exit %d, report %+v: want exit 0, %d charges in the ledger and at the provider, 0 double, 0 lost, 0 dead letters\nstderr:\n%s",
			exit, rep, messages, watch.text())
	}
	wantReceiptedOnce(t, rep, int64(messages))
	t.Logf("%s with %d/%d published: %.2f deliveries per message (%d deliveries, %d duplicates absorbed, %d consumer crashes, %d publishes retried), "+
		"double %d, lost %d; server down and back in %.1fs, demo charging again %.1fs after that (progress lines every 2s), run %.1fs",
		f.what, published, messages, float64(rep.Deliveries)/float64(messages), rep.Deliveries, rep.DuplicatesAbsorbed,
		rep.ConsumerCrashes, rep.PublishRetries, rep.DoubleCharges, rep.Lost,
		backAt.Sub(killedAt).Seconds(), resumedAt.Sub(backAt).Seconds(), rep.ElapsedS)
}

// progressWatch is the demo's stderr: it keeps the text and the charged
// count of the last progress line ("idem demo: N/M payments charged").
type progressWatch struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	partial []byte
	n       int
	changed chan struct{}
}

var progressLine = regexp.MustCompile(`^idem demo: (\d+)/\d+ payments charged`)

func (w *progressWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	w.partial = append(w.partial, p...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		if m := progressLine.FindSubmatch(w.partial[:i]); m != nil {
			w.n, _ = strconv.Atoi(string(m[1]))
			select {
			case w.changed <- struct{}{}:
			default:
			}
		}
		w.partial = w.partial[i+1:]
	}
	return len(p), nil
}

func (w *progressWatch) charged() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

func (w *progressWatch) text() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// await waits until a progress line shows at least n payments charged.
func (w *progressWatch) await(t *testing.T, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for w.charged() < n {
		select {
		case <-w.changed:
		case <-deadline:
			t.Fatalf("after %v: %d payments charged, want %d; stderr:\n%s", timeout, w.charged(), n, w.text())
		}
	}
}

// ownFault returns the kill -9 and restart of svc, whose URL is passed
// to the demo with flag.
func ownFault(svc *ownservice.Service, flag string) fault {
	must := func(f func() error) func(*testing.T) {
		return func(t *testing.T) {
			t.Helper()
			if err := f(); err != nil {
				t.Fatal(err)
			}
		}
	}
	return fault{what: svc.Name + " kill -9", args: []string{flag, svc.URL}, kill: must(svc.Kill), restart: must(svc.Restart)}
}

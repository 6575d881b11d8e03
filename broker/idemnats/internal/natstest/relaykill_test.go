package natstest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemnats"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/nats-io/nats.go/jetstream"
)

// natsProcess is Debian's nats-server (the binary scripts/services
// installs) run as a child process with JetStream on its own port and
// store directory, so that a test can SIGKILL it and start it again on
// the same port and store.
type natsProcess struct {
	t    *testing.T
	bin  string
	dir  string
	port int
	log  string

	mu  sync.Mutex
	cmd *exec.Cmd
}

// startNATSProcess starts the server; it is killed at cleanup. A missing
// binary fails the test under IDEM_TEST_REQUIRE_ALL=1 and skips it
// otherwise.
func startNATSProcess(t *testing.T) *natsProcess {
	t.Helper()
	bin := ""
	for _, c := range []string{"nats-server", "/usr/sbin/nats-server", "/usr/bin/nats-server"} {
		if p, err := exec.LookPath(c); err == nil {
			bin = p
			break
		}
	}
	if bin == "" {
		if testenv.Required() {
			t.Fatal("nats-server not found (Debian's nats-server package; scripts/services installs it)")
		}
		t.Skip("nats-server not found; scripts/services installs it")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	dir := t.TempDir()
	p := &natsProcess{t: t, bin: bin, dir: filepath.Join(dir, "store"), port: port, log: filepath.Join(dir, "nats-server.log")}
	if err := p.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			if b, err := os.ReadFile(p.log); err == nil {
				t.Logf("nats-server log:\n%s", b)
			}
		}
	})
	return p
}

func (p *natsProcess) url() string { return "nats://127.0.0.1:" + strconv.Itoa(p.port) }

// start runs the server and returns once it accepts connections (or
// the error that kept it from doing so within a minute). It may run on
// any goroutine.
func (p *natsProcess) start() error {
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	cmd := exec.Command(p.bin, "-js", "-sd", p.dir, "-a", "127.0.0.1", "-p", strconv.Itoa(p.port), "-n", "idem-relay-kill")
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.bin, err)
	}
	p.mu.Lock()
	p.cmd = cmd
	p.mu.Unlock()
	for deadline := time.Now().Add(time.Minute); ; {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(p.port), time.Second)
		if err == nil {
			return c.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nats-server not accepting connections after a minute: %w", err)
		}
		time.Sleep(testenv.Poll)
	}
}

// kill sends SIGKILL and reaps the process; a no-op when it is not
// running.
func (p *natsProcess) kill() {
	p.mu.Lock()
	cmd := p.cmd
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
}

// killingPublisher wraps the relay's publisher: at each call number in
// kills it publishes the first half of the batch, then SIGKILLs the
// server while the second half is in flight (some of it stored and
// acknowledged, some stored with the acknowledgement lost, some never
// stored); the next call runs against the dead server, and the server is
// started again when that call returns.
type killingPublisher struct {
	pub   idem.Publisher
	srv   *natsProcess
	kills map[int]bool

	mu       sync.Mutex
	calls    int
	down     bool
	failed   int   // rows the publisher reported failed
	downRuns int   // calls made while the server was down
	startErr error // a restart that failed
}

func (k *killingPublisher) Publish(ctx context.Context, msgs []idem.Outgoing) []error {
	k.mu.Lock()
	k.calls++
	kill, down := k.kills[k.calls] && !k.down, k.down
	if kill {
		k.down = true
	}
	k.mu.Unlock()

	var errs []error
	if kill {
		half := len(msgs) / 2
		errs = k.pub.Publish(ctx, msgs[:half])
		rest := make(chan []error, 1)
		go func() { rest <- k.pub.Publish(ctx, msgs[half:]) }()
		k.srv.kill()
		errs = append(errs, <-rest...)
	} else {
		errs = k.pub.Publish(ctx, msgs)
	}

	k.mu.Lock()
	for _, err := range errs {
		if err != nil {
			k.failed++
		}
	}
	restart := down && k.down
	if restart {
		k.downRuns++
		k.down = false
	}
	k.mu.Unlock()
	if restart {
		if err := k.srv.start(); err != nil {
			k.mu.Lock()
			k.startErr = errors.Join(k.startErr, err)
			k.mu.Unlock()
		}
	}
	return errs
}

// TestRelayAcrossServerKill runs the outbox relay from a SQLite outbox to
// a real nats-server that is SIGKILLed twice in the middle of a batch
// and started again on the same store: every row ends sent, the stream
// holds every message, and an idem consumer downstream applies each
// message exactly once, each ordering key's messages in emission order.
// Nothing marked sent was lost with the server, and nothing the server
// stored before its acknowledgement was lost is applied twice.
func TestRelayAcrossServerKill(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv := startNATSProcess(t)

	js := reconnectingJS(t, srv.url(), 20*time.Millisecond)
	s := newStreams(t, js, 10*time.Minute)

	// The outbox: keys × perKey committed rows, nothing sent yet.
	_, store := newSQLiteStore(t, "outbox.db")
	const keys, perKey = 20, 40
	var rows []idemdriver.OutgoingRecord
	for i := range perKey {
		for k := range keys {
			rows = append(rows, idemdriver.OutgoingRecord{
				ID: fmt.Sprintf("k%02d-%03d", k, i), Consumer: "upstream", SourceID: "src",
				Destination: s.subject, Key: fmt.Sprintf("k%02d", k), Payload: []byte("p"),
			})
		}
	}
	tx, err := store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.EmitTx(ctx, tx, &idemdriver.EmitParams{Consumer: "upstream", Messages: rows}); err != nil {
		t.Fatalf("EmitTx: %v", err)
	}
	if err := store.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}

	// The relay, with the server killed at its 5th and 20th publish.
	pub := &killingPublisher{pub: idemnats.NewPublisher(js), srv: srv, kills: map[int]bool{5: true, 20: true}}
	relay, err := idem.NewRelay(idem.RelayConfig{Store: store, Publisher: pub, Workers: 2, Lease: 4 * time.Second,
		MinRetry: 10 * time.Millisecond, MaxRetry: 50 * time.Millisecond, MinPoll: time.Millisecond, MaxPoll: 10 * time.Millisecond,
		Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	testenv.Eventually(t, 2*time.Minute, "every outbox row sent", func() bool {
		st, err := store.OutboxStats(ctx)
		return err == nil && st.Pending == 0 && st.Failed == 0
	}, func() string {
		st, err := store.OutboxStats(ctx)
		pub.mu.Lock()
		defer pub.mu.Unlock()
		return fmt.Sprintf("outbox %+v (%v); %d publish calls, %d failed rows", st, err, pub.calls, pub.failed)
	})
	stop()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("relay Run: %v", err)
	}
	pub.mu.Lock()
	calls, failed, downRuns, startErr := pub.calls, pub.failed, pub.downRuns, pub.startErr
	pub.mu.Unlock()
	if startErr != nil {
		t.Fatal(startErr)
	}
	if downRuns != 2 || failed == 0 {
		t.Fatalf("%d publish calls ran against a killed server and %d rows failed; want 2 and some", downRuns, failed)
	}

	// The stream holds every message (a re-send the duplicate window
	// dropped is not stored twice).
	info, err := s.stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs < uint64(len(rows)) {
		t.Fatalf("stream holds %d messages, want at least %d", info.State.Msgs, len(rows))
	}

	// Downstream, one message at a time: each applied once, in order per key.
	st := newSQLiteTx(t)
	cons, err := s.stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "relay-kill", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	c, err := idemnats.NewConsumer(js, cons, idemnats.Config{Processor: st.proc, Concurrency: 1, DeadLetter: s.dlSubject, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	runConsumer(t, c)
	testenv.Eventually(t, time.Minute, "every message applied downstream", func() bool { _, d := st.effects(t); return d >= len(rows) }, nil)
	if r, d := st.effects(t); r != len(rows) || d != len(rows) {
		t.Fatalf("%d effects for %d distinct IDs, want %d of each", r, d, len(rows))
	}
	last := map[string]int{}
	q, err := st.db.QueryContext(ctx, `SELECT message_id FROM effects ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	for q.Next() {
		var id string
		if err := q.Scan(&id); err != nil {
			t.Fatal(err)
		}
		key, n := id[:3], id[4:]
		i, _ := strconv.Atoi(n)
		if want := last[key]; i != want {
			t.Fatalf("%s applied after %s-%03d, want emission order", id, key, want-1)
		}
		last[key] = i + 1
	}
	if err := q.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d rows through 2 SIGKILLs: %d publish calls, %d failed rows retried, stream holds %d messages", len(rows), calls, failed, info.State.Msgs)
}

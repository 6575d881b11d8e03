package brokertest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// ServerKiller kills a broker's server process and starts it again, for
// RunRelayAcrossKill.
type ServerKiller interface {
	// Kill sends the server process SIGKILL and returns once it is gone.
	// It may be called on any goroutine.
	Kill() error
	// Restart starts the server again on the same storage and address and
	// returns once it accepts connections. It may be called on any
	// goroutine.
	Restart() error
}

// RunRelayAcrossKill runs the outbox relay while the broker's server dies:
// rows committed in an idem.MemoryStore outbox are sent by idem.Relay.Run
// (two workers) through b's Publisher, and k kills the server twice in
// the middle of a publish (after the first half of a batch was
// published and confirmed, while the second half is in flight: each of
// those may end stored and confirmed, stored with its confirm lost, or
// never stored, as the timing falls; the log says how many were
// confirmed). The next publish runs against the dead server and must
// fail every message; the server is started again when it returns, and
// publishes that come meanwhile wait for it. The Publisher must recover
// on its own (a client that reconnects, or a redial).
//
// Then every row must be sent (none pending), and an idem consumer of b
// started afterwards must apply each message exactly once, each ordering
// key's messages in emission order: a message the relay counted sent was
// stored by the server and survived its death, and a message sent twice
// (stored before its confirm was lost) is applied once. The server must keep what
// it confirmed and its queues or streams across a kill; one that may lose
// recent declarations should be given them before (its test's concern).
func RunRelayAcrossKill(t *testing.T, b OutboxBroker, k ServerKiller) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*waitLong)
	defer cancel()
	pub, dest := b.OutboxPublisher()

	store := idem.NewMemoryStore(nil)
	run := fmt.Sprintf("kill%d", time.Now().UnixNano())
	const keys, perKey = 20, 20
	var rows []idemdriver.OutgoingRecord
	for i := range perKey {
		for key := range keys {
			rows = append(rows, idemdriver.OutgoingRecord{
				ID: fmt.Sprintf("%s-k%02d-%03d", run, key, i), Consumer: "upstream", SourceID: "src",
				Destination: dest, Key: fmt.Sprintf("k%02d", key), Payload: fmt.Appendf(nil, "k%02d/%d", key, i),
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

	kp := &killingPublisher{pub: pub, k: k, killAt: []int{4, 12}}
	relay, err := idem.NewRelay(idem.RelayConfig{Store: store, Publisher: kp, Workers: 2, Lease: 4 * time.Second,
		MinRetry: 10 * time.Millisecond, MaxRetry: 100 * time.Millisecond, MinPoll: time.Millisecond, MaxPoll: 10 * time.Millisecond})
	if err != nil {
		t.Fatalf("NewRelay: %v", err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	waitUntil(t, ctx, 2*waitLong, func() (bool, string) {
		pending := store.PendingOutgoing("upstream", "src")
		kp.mu.Lock()
		defer kp.mu.Unlock()
		if kp.killErr != nil || kp.restartErr != nil {
			return true, "" // reported below
		}
		return pending == 0 && kp.kills == 2 && kp.state == serverUp, fmt.Sprintf("%d of %d rows pending; %d publish calls, %d kills, %d calls against a killed server, %d failed rows; kill and restart errors: %v",
			pending, len(rows), kp.calls, kp.kills, kp.downCalls, kp.failed, errors.Join(kp.killErr, kp.restartErr))
	})
	stop()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("relay Run: %v", err)
	}
	kp.mu.Lock()
	calls, failed, faultErr := kp.calls, kp.failed, errors.Join(kp.killErr, kp.restartErr)
	downCalls, liedDown, killed := kp.downCalls, kp.liedDown, kp.killedBatches
	kp.mu.Unlock()
	if faultErr != nil {
		t.Fatalf("kill or restart: %v", faultErr)
	}
	// No confirm can come from a dead server: a publish that started after
	// a kill and returned before the restart began fails every message,
	// or the relay would mark rows sent that the broker never stored.
	// (Another publish that started after the kill may end after the
	// restart, with what the client buffered sent and confirmed.)
	if downCalls == 0 || liedDown != 0 {
		t.Fatalf("%d publishes started against a dead server; those that ended before its restart reported %d messages sent; want some publishes, and none sent", downCalls, liedDown)
	}

	down := startDownstream(t, ctx, b)
	ids := make([]string, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
	}
	down.waitAppliedOnce(t, ctx, ids)
	down.mu.Lock()
	defer down.mu.Unlock()
	for key := range keys {
		k := fmt.Sprintf("k%02d", key)
		for i, p := range down.order[k] {
			if want := fmt.Sprintf("%s/%d", k, i); p != want {
				t.Errorf("key %s: applied %v, want in emission order", k, down.order[k])
				break
			}
		}
	}
	t.Logf("relay across 2 kills: %d rows, %d publish calls, %d failed rows retried, %d deliveries downstream; the killed batches: %s",
		len(rows), calls, failed, down.deliveries.Load(), strings.Join(killed, ", "))
}

// killingPublisher wraps the relay's publisher for RunRelayAcrossKill:
// the first call numbered at least killAt[0] while the server is up
// publishes the first half of its batch, then kills the server while the
// second half is in flight; the first call that starts after the kill
// runs against the dead server, and the server is restarted when it
// returns; calls that come while it restarts wait for it. Then the same
// with killAt[1], and so on.
type killingPublisher struct {
	pub    idem.Publisher
	k      ServerKiller
	killAt []int

	mu            sync.Mutex
	calls         int
	state         serverState
	up            chan struct{} // closed when the restart in progress is done
	kills         int           // kills done
	downCalls     int           // calls that started while the server was dead
	liedDown      int           // messages those calls reported sent before a restart began
	killedBatches []string      // what the kills left of their batches
	failed        int           // rows the publisher reported failed
	killErr       error         // a kill that failed
	restartErr    error         // a restart that failed
}

type serverState int

const (
	serverUp serverState = iota
	serverKilling
	serverDead
	serverRestarting
)

func (p *killingPublisher) Publish(ctx context.Context, msgs []idem.Outgoing) []error {
	p.mu.Lock()
	// While the server restarts, calls wait: a server that comes up before
	// its restart returns would otherwise take every row before the next
	// kill.
	for p.state == serverRestarting {
		up := p.up
		p.mu.Unlock()
		select {
		case <-up:
		case <-ctx.Done():
			errs := make([]error, len(msgs))
			for i := range errs {
				errs[i] = fmt.Errorf("brokertest: waiting for the server's restart: %w", ctx.Err())
			}
			return errs
		}
		p.mu.Lock()
	}
	p.calls++
	kill := p.state == serverUp && p.kills < len(p.killAt) && p.calls >= p.killAt[p.kills]
	if kill {
		p.state = serverKilling
		p.kills++
	}
	down := p.state == serverDead
	if down {
		p.downCalls++
	}
	p.mu.Unlock()

	var errs []error
	if kill {
		half := len(msgs) / 2
		errs = p.pub.Publish(ctx, msgs[:half])
		rest := make(chan []error, 1)
		go func() { rest <- p.pub.Publish(ctx, msgs[half:]) }()
		err := p.k.Kill()
		p.mu.Lock()
		p.state = serverDead
		p.killErr = errors.Join(p.killErr, err)
		p.mu.Unlock()
		errs = append(errs, <-rest...)
		sent := 0
		for _, err := range errs[half:] {
			if err == nil {
				sent++
			}
		}
		p.mu.Lock()
		p.killedBatches = append(p.killedBatches, fmt.Sprintf("%d of %d in flight confirmed", sent, len(msgs)-half))
		p.mu.Unlock()
	} else {
		errs = p.pub.Publish(ctx, msgs)
	}

	p.mu.Lock()
	for _, err := range errs {
		switch {
		case err != nil:
			p.failed++
		case down && p.state == serverDead:
			// Reported sent by a publish that started after the kill and
			// ended before any restart began.
			p.liedDown++
		}
	}
	restart := down && p.state == serverDead
	if restart {
		p.state = serverRestarting
		p.up = make(chan struct{})
	}
	p.mu.Unlock()
	if restart {
		err := p.k.Restart()
		p.mu.Lock()
		p.state = serverUp
		close(p.up)
		p.restartErr = errors.Join(p.restartErr, err)
		p.mu.Unlock()
	}
	return errs
}

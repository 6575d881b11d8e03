package failovertest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemnats"
	"github.com/idem-go/idem/internal/ownservice"
	"github.com/idem-go/idem/internal/testenv"
)

// natsQuiet is how long the NATS rows wait with no message processed
// before counting a published message as lost. (It was 45 s for a while: a
// clean-clone run saw a round's consumer process nothing for 15 s after
// its stream's leader was killed, when a lost pull request took idemnats
// 10 s to notice.)
const natsQuiet = 15 * time.Second

// natsResumeBound is the most a round's consuming may lag behind the
// moment it could resume: the later of the consumer's new leader elected
// (its advisory) and the first publish acknowledged after the kill. A pull
// request waits at the consumer's leader, and one sent while the consumer
// has no leader is dropped without an answer: idemnats notices either
// after two missed one-second heartbeats (2 s) and sends the next. With
// nats.go's default five-second heartbeats it took 10 s, and lags of 5 to
// 6 s were measured.
const natsResumeBound = 4 * time.Second

// TestNATSStreamLeaderFailover publishes messages with stable IDs
// (Nats-Msg-Id) to an R3 stream on a three-node JetStream cluster (Debian's
// nats-server) while idemnats consumes them into a transactional idem
// consumer whose effect is a counter that commits with the record (a
// MemoryStore, which does not fail over). Mid-load the stream's leader is
// SIGKILLed; the other two elect a new one, and the killed node is started
// again on its store. A publish counts once JetStream acknowledged it;
// lost is a message so acknowledged whose effect never ran, doubles an
// effect run twice; the time to recover runs from the kill to the first
// publish acknowledged after it. With R3 a publish is acknowledged once
// two nodes have it, so one node's death loses nothing: asserted, as are
// the doubles, which idem's record rules out whatever JetStream
// redelivers, and that consuming resumes within natsResumeBound of the
// moment it can (see natsRound.check).
func TestNATSStreamLeaderFailover(t *testing.T) {
	t.Parallel()
	testNATSStreamLeaderFailover(t, rounds(t))
}

// testNATSStreamLeaderFailover is TestNATSStreamLeaderFailover with
// rounds failovers, on nats-ha started with env (e.g. the binary,
// IDEM_NATS_HA_BIN).
func testNATSStreamLeaderFailover(t *testing.T, rounds int, env ...string) {
	ctx := t.Context()
	f := startNATSFailover(t, func(c *ownservice.Service) string { return c.URL }, env...)
	var m matrix
	var resumes []time.Duration
	n := messages(t)
	for r := range rounds {
		all := ids(r, n)
		rejoined := make(chan error, 1)
		var killed time.Time
		kill := func() {
			leader, err := streamLeader(ctx, f.stream)
			if err != nil {
				t.Fatal(err)
			}
			if err := ownservice.KillPIDFile(filepath.Join(f.c.Dir, "nats-ha", leader, "nats.pid")); err != nil {
				t.Fatal(err)
			}
			killed = time.Now()
			go func() { rejoined <- f.c.Restart() }()
		}
		// A publish JetStream did not acknowledge within 2 s is sent again.
		published, recovered := publishThrough(t, all, n/3, kill, 2*time.Second, 2*time.Minute, f.publish)
		// Every acknowledged publish should reach the effect; wait until
		// it does, or until nothing more arrives for natsQuiet.
		awaitEffects(all, f.effects.snapshot, natsQuiet)
		if err := <-rejoined; err != nil {
			t.Fatal(err)
		}
		doubles, lost := m.add(roundResult{acked: published, recover: recovered}, all, f.effects.snapshot())
		rr := f.round(killed, recovered, all[n/3:])
		resumes = append(resumes, rr.resumed)
		t.Logf("round %d: %d doubles, %d lost (published, no effect), recovered in %v; %v", r, doubles, lost, recovered, rr)
		if doubles != 0 || lost != 0 {
			t.Errorf("round %d: %d doubles, %d lost; want none with R3 and one node killed", r, doubles, lost)
		}
		rr.check(t, r)
		f.awaitCurrent(t, func(ctx context.Context) (*jetstream.ClusterInfo, error) {
			info, err := f.stream.Info(ctx)
			if err != nil {
				return nil, err
			}
			return info.Cluster, nil
		})
	}
	t.Logf("NATS JetStream R3 (nats-server %s), stream leader killed: %v; consuming resumed %s after the kill",
		f.nc.ConnectedServerVersion(), &m, medianDurations(resumes))
}

// natsFailover is a three-node JetStream cluster of a test's own (nats-ha)
// with an R3 stream, FAILOVER (subjects failover.>, a five-minute
// duplicate window), and its durable consumer, failover (filter
// failover.in, AckWait 5 s), which idemnats runs into a transactional idem
// consumer whose effect counts each message's runs.
type natsFailover struct {
	c       *ownservice.Service
	nc      *nats.Conn
	js      jetstream.JetStream
	stream  jetstream.Stream
	cons    jetstream.Consumer
	effects effectCounter

	// lostPull receives (without blocking) each time idemnats logs a
	// pull request lost without an answer (no heartbeat).
	lostPull chan struct{}

	mu      sync.Mutex
	elected []time.Time // the consumer's leader-elected advisories, as received
}

// startNATSFailover starts nats-ha with env, connects to the URL url
// gives, creates the stream and consumer, and runs idemnats until t ends.
func startNATSFailover(t *testing.T, url func(*ownservice.Service) string, env ...string) *natsFailover {
	t.Helper()
	ctx := t.Context()
	f := &natsFailover{c: ownservice.StartEnv(t, "nats-ha", env...), lostPull: make(chan struct{}, 1)}
	var err error
	f.nc, err = nats.Connect(url(f.c), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.nc.Close)
	if _, err := f.nc.Subscribe("$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED.FAILOVER.failover", func(*nats.Msg) {
		f.mu.Lock()
		f.elected = append(f.elected, time.Now())
		f.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if f.js, err = jetstream.New(f.nc); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "the R3 stream created (a meta leader elected)", func() bool {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		f.stream, err = f.js.CreateOrUpdateStream(cctx, jetstream.StreamConfig{Name: "FAILOVER", Subjects: []string{"failover.>"},
			Replicas: 3, Duplicates: 5 * time.Minute})
		return err == nil
	}, func() string { return fmt.Sprint(err) })
	f.cons, err = f.stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "failover", FilterSubject: "failover.in",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	store := idem.NewMemoryStore(nil)
	consumer, err := idem.NewConsumer(store, idem.Config{Name: "failover", PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { consumer.Close() })
	sub, err := idemnats.NewConsumer(f.js, f.cons, idemnats.Config{
		Processor: idem.Bind(consumer, func(ctx context.Context, tx *idem.MemoryTx, m idem.Message) error {
			tx.OnCommit(func() { f.effects.add(m.ID) })
			return nil
		}),
		DeadLetter: "failover.dead", Concurrency: workers, RetryDelay: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(testLogWriter{t: t, lostPull: f.lostPull}, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(background(ctx, sub.Run))
	return f
}

// publish publishes id to failover.in with id as its Nats-Msg-Id.
func (f *natsFailover) publish(ctx context.Context, id string) error {
	_, err := f.js.Publish(ctx, "failover.in", []byte(id), jetstream.WithMsgID(id))
	return err
}

// natsRound is how consuming came back in one round.
type natsRound struct {
	// resumed runs from the kill to the first effect of a message
	// published after it; -1 if none ran.
	resumed time.Duration
	// ready runs from the kill to the moment consuming could resume: the
	// first publish acknowledged after the kill, or the consumer's first
	// new leader elected after it if that came later (none elected: its
	// leader was not the killed node).
	ready   time.Duration
	elected bool
}

// lag is how long after ready consuming resumed.
func (r natsRound) lag() time.Duration { return r.resumed - r.ready }

func (r natsRound) String() string {
	return fmt.Sprintf("consuming resumed %v after the kill, %v after it could (consumer leader moved: %v)",
		r.resumed.Round(time.Millisecond), r.lag().Round(time.Millisecond), r.elected)
}

// check fails t when no message published after the kill was processed,
// or when consuming resumed more than natsResumeBound after it could.
func (r natsRound) check(t *testing.T, round int) {
	t.Helper()
	if r.resumed < 0 {
		t.Errorf("round %d: no message published after the kill was processed", round)
	} else if r.lag() > natsResumeBound {
		t.Errorf("round %d: %v; want it to resume within %v of the moment it could", round, r, natsResumeBound)
	}
}

// round returns how consuming came back after the kill at killed, given
// the time from the kill to the first publish acknowledged after it, from
// the effects of post (the messages published after the kill).
func (f *natsFailover) round(killed time.Time, recovered time.Duration, post []string) natsRound {
	rr := natsRound{resumed: -1, ready: recovered}
	if first, ok := f.effects.firstOf(post); ok {
		rr.resumed = first.Sub(killed)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, at := range f.elected {
		if at.After(killed) {
			rr.elected = true
			rr.ready = max(rr.ready, at.Sub(killed))
			break
		}
	}
	return rr
}

// awaitCurrent waits until the group info reports has a leader and two
// current, online replicas.
func (f *natsFailover) awaitCurrent(t *testing.T, info func(context.Context) (*jetstream.ClusterInfo, error)) {
	t.Helper()
	testenv.Eventually(t, 2*time.Minute, "every replica current again", func() bool {
		cl, err := info(t.Context())
		if err != nil || cl == nil || cl.Leader == "" || len(cl.Replicas) != 2 {
			return false
		}
		for _, p := range cl.Replicas {
			if !p.Current || p.Offline {
				return false
			}
		}
		return true
	}, nil)
}

// streamLeader returns the name of the stream's leader (node1..node3).
func streamLeader(ctx context.Context, s jetstream.Stream) (string, error) {
	info, err := s.Info(ctx)
	if err != nil {
		return "", err
	}
	if info.Cluster == nil || !strings.HasPrefix(info.Cluster.Leader, "node") {
		return "", errors.New("the stream has no leader")
	}
	return info.Cluster.Leader, nil
}

// testLogWriter writes each log line to t.Log, and signals lostPull
// (without blocking) on a line that says a pull request got no heartbeat.
type testLogWriter struct {
	t        *testing.T
	lostPull chan struct{}
}

func (w testLogWriter) Write(b []byte) (int, error) {
	line := string(b)
	w.t.Log(strings.TrimSuffix(line, "\n"))
	if strings.Contains(line, jetstream.ErrNoHeartbeat.Error()) {
		select {
		case w.lostPull <- struct{}{}:
		default:
		}
	}
	return len(b), nil
}

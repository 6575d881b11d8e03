package failovertest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem/internal/ownservice"
	"github.com/idem-go/idem/internal/testenv"
)

// TestNATSConsumerLeaderFailover is TestNATSStreamLeaderFailover killing,
// each round, the node that leads the JetStream consumer rather than the
// stream, while the client stays connected to another node (node1). The
// followers know the pull request that waited at the old leader, and the
// new one takes it over. Every other round the election is made slow: the
// third node is stopped (SIGSTOP) with the kill, so that no quorum is left,
// until idemnats has given up its waiting pull request for want of
// heartbeats; a request sent while the consumer has no leader is dropped
// without an answer, and only its missing heartbeats tell. A third of the
// round's messages are processed before the kill, the rest published
// after it. Asserted: none lost, none doubled, and consuming resumed within
// natsResumeBound of the new leader's election (or of the first publish
// acknowledged after the kill, if later); reported: the time from the
// kill to the first message processed that was published after it.
func TestNATSConsumerLeaderFailover(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	// Connected to node1 only, so that the killed leader is never the
	// client's own server (a reconnect resends the pull at once).
	f := startNATSFailover(t, func(c *ownservice.Service) string {
		return fmt.Sprintf("nats://127.0.0.1:%d", c.Port("IDEM_NATS_HA_PORT"))
	})
	var resumes, lags []time.Duration
	n := 60
	for r := range reducedRounds(t) {
		all := ids(r, n)
		pre, post := all[:n/3], all[n/3:]
		for _, id := range pre {
			if err := f.publish(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		awaitEffects(pre, f.effects.snapshot, natsQuiet)
		leader := f.consumerLeaderOffNode1(t)
		slow := r%2 == 1
		third := map[string]string{"node2": "node3", "node3": "node2"}[leader]
		if slow {
			f.signal(t, third, syscall.SIGSTOP)
			drain(f.lostPull)
		}
		if err := ownservice.KillPIDFile(filepath.Join(f.c.Dir, "nats-ha", leader, "nats.pid")); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		rejoined := make(chan error, 1)
		go func() {
			if slow {
				// No quorum until the Consumer has given up a pull
				// request; the killed node is restarted only then, so
				// that it does not make the quorum first.
				select {
				case <-f.lostPull:
				case <-ctx.Done():
				}
				f.signal(t, third, syscall.SIGCONT)
			}
			rejoined <- f.c.Restart()
		}()
		published, recovered := publishThrough(t, post, 0, func() {}, 2*time.Second, 2*time.Minute, f.publish)
		got := awaitEffects(all, f.effects.snapshot, natsQuiet)
		lost, doubles := 0, 0
		for _, id := range all {
			if (published[id] || slices.Contains(pre, id)) && got[id] == 0 {
				lost++
			}
			doubles += max(got[id]-1, 0)
		}
		rr := f.round(killed, recovered, post)
		resumes, lags = append(resumes, rr.resumed), append(lags, rr.lag())
		t.Logf("round %d: consumer leader %s killed (slow election: %v); publishing recovered in %v; %v; %d lost, %d doubles", r, leader, slow, recovered, rr, lost, doubles)
		if lost != 0 || doubles != 0 {
			t.Errorf("round %d: %d lost, %d doubles; want none", r, lost, doubles)
		}
		rr.check(t, r)
		if err := <-rejoined; err != nil {
			t.Fatal(err)
		}
		f.awaitCurrent(t, func(ctx context.Context) (*jetstream.ClusterInfo, error) {
			info, err := f.cons.Info(ctx)
			if err != nil {
				return nil, err
			}
			return info.Cluster, nil
		})
	}
	t.Logf("NATS JetStream R3 (nats-server %s), consumer leader killed: consuming resumed %s after the kill, %s after it could; %d rounds",
		f.nc.ConnectedServerVersion(), medianDurations(resumes), medianDurations(lags), len(resumes))
}

// consumerLeaderOffNode1 returns the node (node2 or node3) leading the
// consumer, first asking a leader on node1 (the client's server) to step
// down.
func (f *natsFailover) consumerLeaderOffNode1(t *testing.T) string {
	t.Helper()
	var leader string
	testenv.Eventually(t, time.Minute, "the consumer led by a node other than the client's", func() bool {
		info, err := f.cons.Info(t.Context())
		if err != nil || info.Cluster == nil || !strings.HasPrefix(info.Cluster.Leader, "node") {
			return false
		}
		leader = info.Cluster.Leader
		if leader != "node1" {
			return true
		}
		rctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		_, _ = f.nc.RequestWithContext(rctx, "$JS.API.CONSUMER.LEADER.STEPDOWN."+info.Stream+"."+info.Name, nil)
		return false
	}, func() string { return "leader " + leader })
	return leader
}

// signal sends sig to the nats-server of node (SIGSTOP, SIGCONT), failing
// t (with Error: it may run on another goroutine) if it cannot.
func (f *natsFailover) signal(t *testing.T, node string, sig syscall.Signal) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(f.c.Dir, "nats-ha", node, "nats.pid"))
	var pid int
	if err == nil {
		pid, err = strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	}
	if err == nil {
		err = syscall.Kill(pid, sig)
	}
	if err != nil {
		t.Errorf("%v to %s: %v", sig, node, err)
	}
}

// drain empties c.
func drain(c chan struct{}) {
	for {
		select {
		case <-c:
		default:
			return
		}
	}
}

package idemredis_test

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/idemredis"
	"github.com/redis/go-redis/v9"
)

// clusterNodes is the number of primaries of the test cluster.
const clusterNodes = 3

// startCluster starts a Redis Cluster of three primaries on loopback, from
// the redis-server binary that scripts/services installs, each with its
// files in a temporary directory and, with replicas, one replica of its
// own in sync, and returns a ClusterClient on it. The servers are killed
// at cleanup. The test skips when redis-server is not installed, or fails
// under IDEM_TEST_REQUIRE_ALL=1.
func startCluster(t *testing.T, replicas bool) *redis.ClusterClient {
	t.Helper()
	dir := t.TempDir()
	ctx := t.Context()
	total := clusterNodes
	if replicas {
		total *= 2
	}
	addrs := make([]string, total)
	nodes := make([]*redis.Client, total)
	for i, port := range freeClusterPorts(t, total) {
		p := strconv.Itoa(port)
		addrs[i] = "127.0.0.1:" + p
		nodes[i] = startServer(t, dir, port, "--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, "nodes-"+p+".conf"))
	}
	testenv.Eventually(t, time.Minute, "the cluster nodes answering PING", func() bool {
		for _, n := range nodes {
			if n.Ping(ctx).Err() != nil {
				return false
			}
		}
		return true
	}, nil)
	for i, n := range nodes {
		if i > 0 {
			host, port, _ := net.SplitHostPort(addrs[i])
			if err := nodes[0].ClusterMeet(ctx, host, port).Err(); err != nil {
				t.Fatalf("CLUSTER MEET: %v", err)
			}
		}
		if i >= clusterNodes {
			continue // a replica, below
		}
		lo, hi := i*16384/clusterNodes, (i+1)*16384/clusterNodes-1
		if err := n.ClusterAddSlotsRange(ctx, lo, hi).Err(); err != nil {
			t.Fatalf("CLUSTER ADDSLOTSRANGE %d %d: %v", lo, hi, err)
		}
	}
	var notOK string // the first node not ready, and what it said
	testenv.Eventually(t, time.Minute, "cluster_state:ok on every node", func() bool {
		for i, n := range nodes {
			info, err := n.ClusterInfo(ctx).Result()
			if err != nil || !strings.Contains(info, "cluster_state:ok") ||
				!strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(total)) {
				notOK = fmt.Sprintf("%s: %v %q", addrs[i], err, info)
				return false
			}
		}
		return true
	}, func() string { return notOK })
	for i := clusterNodes; i < total; i++ {
		master, err := nodes[i-clusterNodes].ClusterMyID(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, time.Minute, "CLUSTER REPLICATE accepted", func() bool {
			err = nodes[i].ClusterReplicate(ctx, master).Err()
			return err == nil
		}, func() string { return fmt.Sprint(err) })
		testenv.Eventually(t, time.Minute, "the replica in sync", func() bool {
			info, err := nodes[i].Info(ctx, "replication").Result()
			return err == nil && strings.Contains(info, "master_link_status:up")
		}, nil)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = cc.Close() })
	testenv.Eventually(t, time.Minute, "the cluster client seeing every primary", func() bool {
		var mu sync.Mutex
		seen := 0
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			mu.Lock()
			seen++
			mu.Unlock()
			return c.Ping(ctx).Err()
		})
		if err != nil || seen != clusterNodes {
			cc.ReloadState(ctx)
			return false
		}
		return true
	}, nil)
	return cc
}

// startServer starts redis-server on port with its files in dir and the
// extra arguments, and returns a client on it; the server is killed at
// cleanup. The test skips when redis-server is not installed, or fails
// under IDEM_TEST_REQUIRE_ALL=1.
func startServer(t *testing.T, dir string, port int, extra ...string) *redis.Client {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if testenv.Required() {
			t.Fatalf("redis-server not found (required: IDEM_TEST_REQUIRE_ALL=1): %v", err)
		}
		t.Skipf("redis-server not found, so no servers of the test's own: %v", err)
	}
	p := strconv.Itoa(port)
	cmd := exec.Command(bin, append([]string{"--port", p, "--bind", "127.0.0.1", "--protected-mode", "no",
		"--dir", dir, "--save", "", "--appendonly", "no", "--daemonize", "no",
		"--logfile", filepath.Join(dir, "redis-"+p+".log")}, extra...)...)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server on port %s: %v", p, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + p})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// freeClusterPorts returns n loopback ports that are free, as are their
// cluster bus ports (port + 10000).
// clusterPorts are the ports this test process has given to cluster
// nodes: never given twice. A test that stops a node leaves the other
// nodes of its cluster calling that address; a node of another test's
// cluster started there would be met by them and join their cluster
// (cluster_known_nodes then never matches).
var clusterPorts = struct {
	mu   sync.Mutex
	used map[int]bool
}{used: map[int]bool{}}

func freeClusterPorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	clusterPorts.mu.Lock()
	defer clusterPorts.mu.Unlock()
	for tries := 0; len(ports) < n && tries < 100; tries++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		if port+10000 > 65535 || clusterPorts.used[port] {
			l.Close()
			continue
		}
		bus, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000))
		l.Close()
		if err != nil {
			continue
		}
		bus.Close()
		clusterPorts.used[port] = true
		ports = append(ports, port)
	}
	if len(ports) < n {
		t.Fatalf("found %d free port pairs, want %d", len(ports), n)
	}
	return ports
}

// TestCluster runs the store on a Redis Cluster of three primaries: the
// lease conformance suite (any script touching keys of two slots would
// fail with CROSSSLOT), one consumer's records spread over the primaries
// while its index, runs and purge lock share one slot, and a purge whose
// records and index live on different nodes.
func TestCluster(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a Redis Cluster; skipped with -short")
	}
	cc := startCluster(t, false)
	// The cluster refuses a script over keys of two slots, so a store that
	// wrote one would fail the cases below.
	err := cc.Eval(t.Context(), "return 1", []string{"{a}x", "{b}x"}).Err()
	if err == nil || !strings.Contains(err.Error(), "CROSSSLOT") {
		t.Fatalf("EVAL over keys of two slots: %v, want a CROSSSLOT error", err)
	}

	t.Run("Conformance", func(t *testing.T) {
		t.Parallel()
		clusterConformance(t, cc)
	})

	t.Run("ConsumerKeysShareASlot", func(t *testing.T) {
		t.Parallel()
		b := setup(t, cc)
		for _, consumer := range []string{"c", "payments", "a{b}", "x\u00e9"} {
			var slots []int64
			for _, suffix := range []string{idemredis.DoneSuffix, idemredis.RunsSuffix, idemredis.PurgeSuffix} {
				k := b.store.ConsumerKey(consumer, suffix)
				slot, err := cc.ClusterKeySlot(b.ctx, k).Result()
				if err != nil {
					t.Fatalf("CLUSTER KEYSLOT %q: %v", k, err)
				}
				if int(slot) != keySlot(k) {
					t.Errorf("%q: the server puts %q in slot %d, keySlot says %d", consumer, k, slot, keySlot(k))
				}
				slots = append(slots, slot)
			}
			if slots[0] != slots[1] || slots[1] != slots[2] {
				t.Errorf("%q: index, runs and lock in slots %v, want one slot", consumer, slots)
			}
		}
		// A purge and the runs work on the cluster: each script touches
		// one slot.
		if err := b.store.MarkRunning(b.ctx, &idemdriver.MarkRunningParams{Consumer: "c"}); err != nil {
			t.Fatal(err)
		}
		if runs := b.runs(t, "c"); len(runs) != 1 {
			t.Errorf("runs on the cluster: %v, want 1", runs)
		}
	})

	t.Run("RecordsSpreadAndPurge", func(t *testing.T) {
		t.Parallel()
		b := setup(t, cc)
		old := b.seed(t, "c", "old-", 50)
		b.shift(t, "c", 8*day)
		ids := append(old, b.seed(t, "c", "new-", 10)...)
		now := b.serverNow(t)
		b.addRun(t, "c", now.Add(-8*day-time.Minute), now)
		var mu sync.Mutex
		perNode := map[string]int{}
		err := cc.ForEachMaster(b.ctx, func(ctx context.Context, c *redis.Client) error {
			iter := c.Scan(ctx, 0, b.prefix+"*", 1000).Iterator()
			n := 0
			for iter.Next(ctx) {
				if k := iter.Val(); !strings.HasSuffix(k, idemredis.StepsSuffix) && !strings.HasSuffix(k, idemredis.DoneSuffix) && !strings.HasSuffix(k, idemredis.RunsSuffix) {
					n++
				}
			}
			mu.Lock()
			perNode[c.Options().Addr] = n
			mu.Unlock()
			return iter.Err()
		})
		if err != nil {
			t.Fatal(err)
		}
		total, nonEmpty := 0, 0
		for _, n := range perNode {
			total += n
			if n > 0 {
				nonEmpty++
			}
		}
		if total != len(ids) || nonEmpty < 2 {
			t.Errorf("records per primary %v: want %d in all, on more than one primary", perNode, len(ids))
		}
		var calls []int64
		res, err := idem.Purge(b.ctx, b.store, idem.PurgeParams{Consumer: "c", RetentionWindow: 7 * day, BatchSize: 20, OnBatch: func(n int64) { calls = append(calls, n) }})
		if err != nil || res.Deleted != 50 || fmt.Sprint(calls) != "[20 40 50]" {
			t.Errorf("purge on the cluster: %+v, %v, OnBatch %v; want 50 deleted in [20 40 50]", res, err, calls)
		}
		if n := b.count(t, "c"); n != 10 {
			t.Errorf("records after the purge: %d, want 10", n)
		}
	})
}

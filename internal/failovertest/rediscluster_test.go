package failovertest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/internal/ownservice"
	"github.com/idem-go/idem/store/idemredis"
)

// slowRounds is the number of failovers of the slow rows (the Redis
// Cluster's, the HTTP proxy's): 2, for scripts/test, unless
// IDEM_FAILOVER_FULL=1 asks for the full IDEM_FAILOVER_ROUNDS (5), as
// docs/failover.md measures them.
func slowRounds(t *testing.T) int {
	if os.Getenv("IDEM_FAILOVER_FULL") == "1" {
		return rounds(t)
	}
	return min(2, rounds(t))
}

// TestRedisClusterFailover runs the lease mode, as TestRedisSentinelFailover
// does, on a Redis Cluster of three masters with a replica each
// (scripts/services redis-cluster, cluster-node-timeout 2 s) through
// go-redis's ClusterClient. Each round picks the master serving slot 0 and
// only message IDs whose records it holds, so the whole load is on the
// master that dies (the other two carry on untouched); mid-load that master
// is SIGKILLed, its replica takes its slots over by itself once the others
// have marked it failed, and the killed node is started again, rejoining
// as the new master's replica. Counted and asserted as on Sentinel:
// nothing acknowledged without its effect; with WaitReplicas 1 (each write
// and its WAIT sent to the master of the record's slot) no fencing token
// issued twice.
func TestRedisClusterFailover(t *testing.T) {
	t.Parallel()
	c, cc := startRedisCluster(t)
	forWaitConfigs(t, cc, "3 replica(s) replicate asynchronously", func(t *testing.T, store *idemredis.Store, prefix, risk string, waits bool) {
		v := &clusterVictim{t: t, c: c, cc: cc, prefix: prefix}
		testRedisFailover(t, store, risk, waits, v.failover, slowRounds(t), v.ids)
	})
}

// startRedisCluster starts redis-cluster and returns it and a
// ClusterClient on it (1 s timeouts), closed at cleanup.
func startRedisCluster(t *testing.T) (*ownservice.Service, *redis.ClusterClient) {
	c := ownservice.Start(t, "redis-cluster")
	opt, err := redis.ParseClusterURL(c.URL)
	if err != nil {
		t.Fatal(err)
	}
	opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = time.Second, time.Second, time.Second
	cc := redis.NewClusterClient(opt)
	t.Cleanup(func() { _ = cc.Close() })
	return c, cc
}

// clusterVictim picks, for each round, the master to kill (the one serving
// slot 0) and, for the lease rows, message IDs whose records it holds.
type clusterVictim struct {
	t      *testing.T
	c      *ownservice.Service
	cc     *redis.ClusterClient
	prefix string
	addr   string // the master to kill, host:port
}

// pick chooses the master to kill: the one serving slot 0. It returns
// the cluster's slots.
func (v *clusterVictim) pick() []redis.ClusterSlot {
	var slots []redis.ClusterSlot
	v.addr = ""
	for deadline := time.Now().Add(time.Minute); v.addr == ""; time.Sleep(100 * time.Millisecond) {
		var err error
		if slots, err = v.cc.ClusterSlots(v.t.Context()).Result(); err == nil {
			for _, s := range slots {
				if s.Start == 0 && len(s.Nodes) > 0 {
					v.addr = s.Nodes[0].Addr
				}
			}
		}
		if v.addr == "" && time.Now().After(deadline) {
			v.t.Fatalf("no master serves slot 0: %v", err)
		}
	}
	return slots
}

// ids picks the master to kill and returns n message IDs of round r whose
// record keys (consumer "failover", v.prefix) are in its slots.
func (v *clusterVictim) ids(r, n int) []string {
	ctx := v.t.Context()
	slots := v.pick()
	out := make([]string, 0, n)
	for i := 0; len(out) < n; i++ {
		id := fmt.Sprintf("r%d-%05d", r, i)
		// The record key as idemredis builds it: these IDs need no escaping.
		slot, err := v.cc.ClusterKeySlot(ctx, v.prefix+"{failover\x1f"+id+"}").Result()
		if err != nil {
			v.t.Fatal(err)
		}
		for _, s := range slots {
			if len(s.Nodes) > 0 && s.Nodes[0].Addr == v.addr && int64(s.Start) <= slot && slot <= int64(s.End) {
				out = append(out, id)
			}
		}
	}
	return out
}

// failover SIGKILLs the master ids chose and returns scripts/services
// start, which waits for its replica to take its slots over and starts it
// again as that replica's replica.
func (v *clusterVictim) failover(killed func()) (func() error, error) {
	_, p, _ := strings.Cut(v.addr, ":")
	port, err := strconv.Atoi(p)
	if err != nil {
		return nil, fmt.Errorf("master address %q: %w", v.addr, err)
	}
	node := port - v.c.Port("IDEM_REDIS_CLUSTER_PORT") + 1
	if err := ownservice.KillPIDFile(filepath.Join(v.c.Dir, "redis-cluster", "node"+strconv.Itoa(node), "redis.pid")); err != nil {
		return nil, err
	}
	killed()
	return v.c.Restart, nil
}

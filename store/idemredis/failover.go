package idemredis

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/idemdriver"
)

var _ idemdriver.FailoverRiskReporter = (*Store)(nil)

// FailoverRisk counts the replicas of the server behind the client (of
// every master, through a Cluster client) from INFO replication's
// connected_slaves, and compares Config.WaitReplicas with the most any
// one master has (a write waits for the replicas of its own master). Redis replicates asynchronously: without
// Config.WaitReplicas, or with fewer than the replicas, a failover can
// promote a replica that lacks the last acknowledged lease writes: a lost
// completion runs its message again, a lost takeover can issue one
// fencing token twice. It returns "" without replicas or when every write
// waits for all of them, else one line with the counts. See
// docs/failover.md.
func (s *Store) FailoverRisk(ctx context.Context) (string, error) {
	var replicas, most atomic.Int64
	count := func(ctx context.Context, c redis.UniversalClient) error {
		info, err := c.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		n, err := connectedReplicas(info)
		replicas.Add(int64(n))
		for m := most.Load(); int64(n) > m && !most.CompareAndSwap(m, int64(n)); m = most.Load() {
		}
		return err
	}
	var err error
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return count(ctx, c) })
	} else {
		err = count(ctx, s.client)
	}
	if err != nil {
		return "", fmt.Errorf("idemredis: reading INFO replication: %w", err)
	}
	switch n, m := replicas.Load(), most.Load(); {
	case n > 0 && s.wait == 0:
		return fmt.Sprintf("%d replica(s) replicate asynchronously and idemredis sends no WAIT (Config.WaitReplicas): a failover can lose acknowledged lease writes", n), nil
	case m > int64(s.wait) && s.wait > 0:
		return fmt.Sprintf("%d replica(s) of one master, and each write waits for %d (Config.WaitReplicas): a failover to one it did not wait for can lose acknowledged lease writes", m, s.wait), nil
	}
	return "", nil
}

// connectedReplicas reads connected_slaves from INFO replication's text.
func connectedReplicas(info string) (int, error) {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "connected_slaves:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, fmt.Errorf("no connected_slaves in INFO replication")
}

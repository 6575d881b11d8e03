package idemredis_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/idemredis"
)

// TestClusterWaitReplicas runs the store with WaitReplicas 1 on a Redis
// Cluster of three primaries with one replica each: the lease conformance
// suite passes with every write and its WAIT sent to the master of its
// slot; the store reports no failover risk with WaitReplicas 1 and the
// three asynchronous replicas without it. Then one replica is stopped:
// an acquire on a slot of its master returns ErrNotReplicated and gives
// its lease and run point back (checkGivenBack), while a write on another
// master's slot still succeeds, so the WAIT counted the replicas of the
// write's own master.
func TestClusterWaitReplicas(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a Redis Cluster; skipped with -short")
	}
	cc := startCluster(t, true)
	ctx := t.Context()
	waiting, _ := conformWaiting(t, cc, "3 replica(s) replicate asynchronously")

	// Stop one replica; its master is the one it named.
	var mu sync.Mutex
	var orphan string // the master's address
	err := cc.ForEachSlave(ctx, func(ctx context.Context, c *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		if orphan != "" {
			return nil
		}
		info, err := c.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		orphan = "127.0.0.1:" + infoField(info, "master_port")
		if err := c.Shutdown(ctx).Err(); err != nil && !strings.Contains(err.Error(), "closed") && !errors.Is(err, context.Canceled) {
			t.Logf("SHUTDOWN of a replica: %v", err)
		}
		return nil
	})
	if err != nil || orphan == "127.0.0.1:" {
		t.Fatalf("stopping a replica: %v (its master %q)", err, orphan)
	}
	testenv.Eventually(t, time.Minute, "the master without its replica", func() bool {
		c := redis.NewClient(&redis.Options{Addr: orphan})
		defer c.Close()
		info, err := c.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "connected_slaves:0")
	}, nil)
	// Four message IDs on the orphaned master, two elsewhere.
	var onOrphan, elsewhere []string
	for i := 0; len(onOrphan) < 4 || len(elsewhere) < 2; i++ {
		id := "m-" + strconv.Itoa(i)
		m, err := cc.MasterForKey(ctx, waiting.store.RecordKey("c", id))
		if err != nil {
			t.Fatal(err)
		}
		if m.Options().Addr == orphan {
			onOrphan = append(onOrphan, id)
		} else {
			elsewhere = append(elsewhere, id)
		}
	}
	checkGivenBack(t, cc, waiting.prefix, onOrphan[:3])
	short, err := idemredis.New(cc, &idemredis.Config{Prefix: waiting.prefix, WaitReplicas: 1, WaitTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := short.Acquire(ctx, &idemdriver.AcquireParams{Consumer: "c", MessageID: elsewhere[0], Fingerprint: []byte("f"), Lease: time.Minute}); err != nil {
		t.Errorf("Acquire on a master with its replica: %v", err)
	}
	res, errs, err := short.AcquireBatch(ctx, []*idemdriver.AcquireParams{
		{Consumer: "c", MessageID: onOrphan[3], Fingerprint: []byte("f"), Lease: time.Minute},
		{Consumer: "c", MessageID: elsewhere[1], Fingerprint: []byte("f"), Lease: time.Minute},
	})
	if err != nil || len(errs) != 2 {
		t.Fatalf("AcquireBatch: %v, %v", errs, err)
	}
	if !errors.Is(errs[0], idemredis.ErrNotReplicated) || errs[1] != nil || !res[1].Acquired {
		t.Errorf("AcquireBatch across masters: %+v, %v; want the first ErrNotReplicated, the second acquired", res, errs)
	}
	// checkGivenBack's three retries and the two acquired elsewhere; the
	// batch's acquire on the orphaned master was given back.
	if n, err := waiting.store.CountRecords(ctx, "c"); err != nil || n != 5 {
		t.Errorf("records: %d, %v; want 5", n, err)
	}
}

// infoField returns the value of name in an INFO reply.
func infoField(info, name string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return fmt.Sprintf("<no %s>", name)
}

package idemredis_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/idemredis"
)

// TestWaitReplicasConfig: WaitReplicas needs a *redis.Client or a
// *redis.ClusterClient (a Ring is refused); negative values are refused.
func TestWaitReplicasConfig(t *testing.T) {
	t.Parallel()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cc.Close()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	defer ring.Close()
	for _, tt := range []struct {
		client redis.UniversalClient
		cfg    idemredis.Config
	}{
		{ring, idemredis.Config{WaitReplicas: 1}},
		{c, idemredis.Config{WaitReplicas: -1}},
		{c, idemredis.Config{WaitReplicas: 1, WaitTimeout: -time.Second}},
	} {
		if _, err := idemredis.New(tt.client, &tt.cfg); !errors.Is(err, idemdriver.ErrInvalidConfig) {
			t.Errorf("%T, %+v: %v, want ErrInvalidConfig", tt.client, tt.cfg, err)
		}
	}
	for _, cfg := range []idemredis.Config{{}, {WaitReplicas: 1}} {
		if _, err := idemredis.New(cc, &cfg); err != nil {
			t.Errorf("a Cluster client, %+v: %v", cfg, err)
		}
	}
}

// TestWaitReplicas starts a master and a replica of it: the lease
// conformance suite passes with every write waiting for the replica; the
// store reports no failover risk with WaitReplicas 1 and one without it.
// Then the replica is stopped: a write returns ErrNotReplicated, having
// happened on the master (the record is there, its lease held).
func TestWaitReplicas(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ports := freeClusterPorts(t, 2)
	master := startServer(t, dir, ports[0])
	replica := startServer(t, dir, ports[1], "--replicaof", "127.0.0.1", strconv.Itoa(ports[0]))
	ctx := t.Context()
	testenv.Eventually(t, time.Minute, "the replica in sync", func() bool {
		info, err := replica.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	}, nil)
	waiting, plain := conformWaiting(t, master, "1 replica(s) replicate asynchronously")
	if err := replica.Shutdown(ctx).Err(); err != nil && !strings.Contains(err.Error(), "closed") {
		t.Logf("SHUTDOWN of the replica: %v", err)
	}
	testenv.Eventually(t, time.Minute, "the master without its replica", func() bool {
		info, err := master.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "connected_slaves:0")
	}, nil)
	short, err := idemredis.New(master, &idemredis.Config{Prefix: waiting.prefix, WaitReplicas: 1, WaitTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	p := &idemdriver.AcquireParams{Consumer: "c", MessageID: "m-1", Fingerprint: []byte("f"), Lease: time.Minute}
	if _, err := short.Acquire(ctx, p); !errors.Is(err, idemredis.ErrNotReplicated) {
		t.Fatalf("Acquire without the replica: %v, want ErrNotReplicated", err)
	}
	res, err := waiting.store.Acquire(ctx, p) // the plain path would do as well: the record exists
	if err == nil || res.Acquired {
		t.Fatalf("second Acquire: %+v, %v; want the first's lease held and ErrNotReplicated", res, err)
	}
	n, err := plain.store.CountRecords(ctx, "c")
	if err != nil || n != 0 {
		t.Errorf("plain prefix: %d records, %v", n, err)
	}
	unwaited, err := idemredis.New(master, &idemredis.Config{Prefix: waiting.prefix})
	if err != nil {
		t.Fatal(err)
	}
	res, err = unwaited.Acquire(ctx, p)
	if err != nil || res.Acquired || res.State != idemdriver.StateInProgress {
		t.Errorf("the record after ErrNotReplicated: %+v, %v; want in progress, not acquired", res, err)
	}
}

// conformWaiting runs the lease conformance suite on client with
// WaitReplicas 1 (WaitTimeout 5 s), then checks the failover risk each
// store reports: none with WaitReplicas 1, noWait without it. It returns
// a store of each kind.
func conformWaiting(t *testing.T, client redis.UniversalClient, noWait string) (waiting, plain *testBundle) {
	t.Helper()
	cfg := idemredis.Config{WaitReplicas: 1, WaitTimeout: 5 * time.Second}
	t.Run("Conformance", func(t *testing.T) {
		idemtest.RunLease(t, idemtest.LeaseHarness{New: func(t *testing.T) *idemtest.LeaseSetup {
			return setupWith(t, client, cfg).leaseSetup()
		}})
	})
	waiting = setupWith(t, client, cfg)
	if risk, err := waiting.store.FailoverRisk(t.Context()); err != nil || risk != "" {
		t.Errorf("WaitReplicas 1, one replica per master: risk %q, %v; want none", risk, err)
	}
	plain = setup(t, client)
	if risk, err := plain.store.FailoverRisk(t.Context()); err != nil || !strings.Contains(risk, noWait) {
		t.Errorf("no WaitReplicas: risk %q, %v; want it to say %q", risk, err, noWait)
	}
	return waiting, plain
}

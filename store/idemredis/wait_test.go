package idemredis_test

import (
	"errors"
	"slices"
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
// *redis.ClusterClient (a Ring is refused); negative values are refused,
// and so is a WaitTimeout the client's ReadTimeout does not exceed by
// idemredis.WaitReadMargin.
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
	// A client that would stop reading before WAIT answers: go-redis
	// would take the timeout for a lost reply and send the write again.
	tight := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ReadTimeout: time.Second})
	defer tight.Close()
	tightCluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, ReadTimeout: time.Second})
	defer tightCluster.Close()
	unbounded := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ReadTimeout: -1})
	defer unbounded.Close()
	for _, tt := range []struct {
		client redis.UniversalClient
		cfg    idemredis.Config
		ok     bool
	}{
		{tight, idemredis.Config{WaitReplicas: 1}, false}, // WaitTimeout 1 s by default
		{tightCluster, idemredis.Config{WaitReplicas: 1, WaitTimeout: 800 * time.Millisecond}, false},
		{tight, idemredis.Config{WaitReplicas: 1, WaitTimeout: 500 * time.Millisecond}, true},
		{tightCluster, idemredis.Config{WaitReplicas: 1, WaitTimeout: 500 * time.Millisecond}, true},
		{unbounded, idemredis.Config{WaitReplicas: 1, WaitTimeout: time.Minute}, true},
		{tight, idemredis.Config{WaitTimeout: time.Minute}, true}, // no WAIT
	} {
		_, err := idemredis.New(tt.client, &tt.cfg)
		if tt.ok && err != nil || !tt.ok && !errors.Is(err, idemdriver.ErrInvalidConfig) {
			t.Errorf("%T with ReadTimeout 1 s, %+v: %v; want ok %v, else ErrInvalidConfig", tt.client, tt.cfg, err, tt.ok)
		}
	}
}

// TestWaitReplicas starts a master and a replica of it: the lease
// conformance suite passes with every write waiting for the replica; the
// store reports no failover risk with WaitReplicas 1 and one without it.
// Then the replica is stopped: an acquire returns ErrNotReplicated and
// gives its lease and run point back (checkGivenBack).
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
	checkGivenBack(t, master, waiting.prefix, []string{"m-1", "m-2", "m-3"})
	n, err := plain.store.CountRecords(ctx, "c")
	if err != nil || n != 0 {
		t.Errorf("plain prefix: %d records, %v", n, err)
	}
}

// checkGivenBack checks, on a client whose master (of ids' slots) has lost
// its replica, that an acquire whose WAIT falls short returns
// ErrNotReplicated and gives back its lease and its run point, so that
// the retry runs as if the failed acquire had never been: ids[0] a new
// record (the retry is attempt 1, token 1, with no earlier run point),
// ids[1] a takeover of an expired lease (the retry takes over with a new
// token, attempt 2, and finds the first attempt's run point only), ids[2]
// a new record through AcquireBatch. A lease core on top would otherwise
// answer the retry "outcome unknown" for a call never made.
func checkGivenBack(t *testing.T, client redis.UniversalClient, prefix string, ids []string) {
	t.Helper()
	ctx := t.Context()
	short, err := idemredis.New(client, &idemredis.Config{Prefix: prefix, WaitReplicas: 1, WaitTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	unwaited, err := idemredis.New(client, &idemredis.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	params := func(id string) *idemdriver.AcquireParams {
		return &idemdriver.AcquireParams{Consumer: "c", MessageID: id, Fingerprint: []byte("f"), Lease: time.Minute, StepPrefix: "run:"}
	}
	retry := func(id string, token int64, attempt int, steps ...string) {
		t.Helper()
		res, err := unwaited.Acquire(ctx, params(id))
		if err != nil || !res.Acquired || res.Token != token || res.Attempt != attempt {
			t.Errorf("%s: the retry after ErrNotReplicated: %+v, %v; want acquired, token %d, attempt %d", id, res, err, token, attempt)
			return
		}
		var got []string
		for name := range res.Steps {
			got = append(got, name)
		}
		slices.Sort(got)
		if !slices.Equal(got, steps) {
			t.Errorf("%s: the retry found recovery points %q, want %q (a run point of the failed acquire means outcome unknown)", id, got, steps)
		}
	}

	// A new record.
	if _, err := short.Acquire(ctx, params(ids[0])); !errors.Is(err, idemredis.ErrNotReplicated) {
		t.Fatalf("Acquire without the replica: %v, want ErrNotReplicated", err)
	}
	retry(ids[0], 1, 1)

	// A takeover: attempt 1 holds token 1 and its lease runs out.
	if res, err := unwaited.Acquire(ctx, params(ids[1])); err != nil || !res.Acquired {
		t.Fatalf("first attempt at %s: %+v, %v", ids[1], res, err)
	}
	if err := unwaited.ExpireLease(ctx, "c", ids[1]); err != nil {
		t.Fatal(err)
	}
	if _, err := short.Acquire(ctx, params(ids[1])); !errors.Is(err, idemredis.ErrNotReplicated) {
		t.Fatalf("takeover without the replica: %v, want ErrNotReplicated", err)
	}
	// Token 2 went to the failed takeover and is never issued again.
	retry(ids[1], 3, 2, "run:1")

	// A batch.
	res, errs, err := short.AcquireBatch(ctx, []*idemdriver.AcquireParams{params(ids[2])})
	if err != nil || len(errs) != 1 || !errors.Is(errs[0], idemredis.ErrNotReplicated) {
		t.Fatalf("AcquireBatch without the replica: %+v, %v, %v; want ErrNotReplicated", res, errs, err)
	}
	retry(ids[2], 1, 1)
}

// conformWaiting runs the lease conformance suite on client with
// WaitReplicas 1 (WaitTimeout 2 s, within go-redis's 5 s ReadTimeout),
// then checks the failover risk each store reports: none with
// WaitReplicas 1, noWait without it. It returns a store of each kind.
func conformWaiting(t *testing.T, client redis.UniversalClient, noWait string) (waiting, plain *testBundle) {
	t.Helper()
	cfg := idemredis.Config{WaitReplicas: 1, WaitTimeout: 2 * time.Second}
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

package failovertest

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/ownservice"
	"github.com/idem-go/idem/store/idemredis"
)

// TestRedisSentinelFailover runs the lease mode on a Redis master with a
// replica and a Sentinel, with an external counting effect (a counter in
// the test, outside Redis) and clients on go-redis's Sentinel-aware
// failover client. Every message is delivered twice, the second copy
// later in the stream, as brokers do: a completion the failover lost
// shows as a second run of the effect. Mid-load the master is SIGKILLed
// and the Sentinel promotes the replica. Nothing is acknowledged without
// its effect (the effect runs before the completion that precedes the
// acknowledgement), asserted; the effects that ran twice are recorded,
// not asserted: without WAIT, Redis replicates asynchronously; with
// WaitReplicas 1 every write the store reported done is on the replica,
// but an attempt killed between its effect and its completion is run
// again by the next one, as after any crash in lease mode. What tells a
// lost write is a fencing token issued twice (a run whose token is not
// above an earlier run's): asserted never to happen with WaitReplicas.
func TestRedisSentinelFailover(t *testing.T) {
	t.Parallel()
	_, client, failover := startSentinel(t)
	forWaitConfigs(t, client, "1 replica(s) replicate asynchronously", func(t *testing.T, store *idemredis.Store, _, risk string, waits bool) {
		testRedisFailover(t, store, risk, waits, failover, rounds(t), nil)
	})
}

// waitTimeout is the stores' WaitTimeout with WaitReplicas: the clients
// read with a 1 s timeout, which must exceed it by
// idemredis.WaitReadMargin (a WAIT whose reply the client stopped reading
// would be sent again, with its write, by go-redis).
const waitTimeout = 500 * time.Millisecond

// forWaitConfigs runs run as a subtest for each WaitReplicas measured (0,
// then 1), with a store on client under a prefix of its own; risk is the
// failover risk the store should report (noWaitRisk without WAIT, none
// with it).
func forWaitConfigs(t *testing.T, client redis.UniversalClient, noWaitRisk string,
	run func(t *testing.T, store *idemredis.Store, prefix, risk string, waits bool)) {
	for _, cfg := range []struct {
		name string
		wait int
		risk string
	}{
		{"no_wait", 0, noWaitRisk},
		{"wait_1", 1, ""},
	} {
		t.Run(cfg.name, func(t *testing.T) {
			prefix := "failover-" + cfg.name + ":"
			store, err := idemredis.New(client, &idemredis.Config{Prefix: prefix, WaitReplicas: cfg.wait, WaitTimeout: waitTimeout})
			if err != nil {
				t.Fatal(err)
			}
			run(t, store, prefix, cfg.risk, cfg.wait > 0)
		})
	}
}

// startSentinel starts redis-ha and returns it, a client on it through
// its Sentinel (1 s timeouts) and the failover of a round
// (sentinelFailover); the clients are closed at cleanup.
func startSentinel(t *testing.T) (*ownservice.Service, *redis.Client, func(killed func()) (func() error, error)) {
	c := ownservice.Start(t, "redis-ha")
	opt, err := redis.ParseFailoverURL(c.URL)
	if err != nil {
		t.Fatal(err)
	}
	opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = time.Second, time.Second, time.Second
	client := redis.NewFailoverClient(opt)
	t.Cleanup(func() { _ = client.Close() })
	sentinel := redis.NewSentinelClient(&redis.Options{Addr: opt.SentinelAddrs[0]})
	t.Cleanup(func() { _ = sentinel.Close() })
	return c, client, sentinelFailover(t, c, sentinel, opt.MasterName)
}

// sentinelFailover returns the failover of a round on redis-ha: the
// master the Sentinel names SIGKILLed, then the Sentinel's failover and
// the killed node back as a replica.
func sentinelFailover(t *testing.T, c *ownservice.Service, sentinel *redis.SentinelClient, masterName string) func(killed func()) (func() error, error) {
	ctx := t.Context()
	return func(killed func()) (func() error, error) {
		addr, err := sentinel.GetMasterAddrByName(ctx, masterName).Result()
		if err != nil {
			return nil, err
		}
		port, err := strconv.Atoi(addr[1])
		if err != nil {
			return nil, err
		}
		pidFile, err := primaryPIDFile(c, port)
		if err != nil {
			return nil, err
		}
		if err := ownservice.KillPIDFile(pidFile); err != nil {
			return nil, err
		}
		killed()
		// start waits for the Sentinel's failover, then starts the killed
		// node as a replica of the new master.
		return c.Restart, nil
	}
}

// testRedisFailover runs nRounds rounds of one configuration on store,
// each with failover; roundIDs (nil: ids) gives a round's message IDs.
func testRedisFailover(t *testing.T, store *idemredis.Store, risk string, waits bool,
	failover func(killed func()) (func() error, error), nRounds int, roundIDs func(r, n int) []string) {
	ctx := t.Context()
	if roundIDs == nil {
		roundIDs = func(r, n int) []string { return ids(r, n) }
	}
	logs := &riskLog{}
	consumer, err := idem.NewLeaseConsumer(store, idem.Config{
		Name: "failover", PurgeInterval: -1, Logger: slog.New(logs), Lease: 2 * time.Second, StoreTimeout: 2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	checkRiskWarning(t, logs, store, risk)
	var mu sync.Mutex
	effects := map[string]int{}
	reissued := map[string]int{} // runs whose fencing token an earlier run had had: a lost write
	maxToken := map[string]int64{}
	process := func(ctx context.Context, id string) error {
		_, err := consumer.Process(ctx, idem.Message{ID: id, Payload: []byte(id)},
			func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
				mu.Lock()
				effects[id]++
				if a.Token <= maxToken[id] {
					reissued[id]++
				}
				maxToken[id] = max(maxToken[id], a.Token)
				mu.Unlock()
				return idem.Result{}, nil
			})
		return err
	}
	var m matrix
	n := messages(t)
	for r := range nRounds {
		all := roundIDs(r, n)
		res := round{deliveries: twice(all, n/4), process: process, killAt: n / 3, failover: failover}.run(ctx, t)
		mu.Lock()
		doubles, lost := m.add(res, all, effects)
		tokens := 0
		for _, id := range all {
			tokens += reissued[id]
		}
		mu.Unlock()
		m.reissued = append(m.reissued, tokens)
		t.Logf("round %d: %d doubles (%d with a fencing token issued again), %d lost, recovered in %v", r, doubles, tokens, lost, res.recover)
		if lost != 0 {
			t.Errorf("round %d: %d messages acknowledged without their effect", r, lost)
		}
		if waits && tokens != 0 {
			t.Errorf("round %d: %d fencing tokens issued twice with WaitReplicas: a write the store reported done was lost", r, tokens)
		}
	}
	t.Logf("%s: %v", t.Name(), &m)
}

// twice returns every ID of all twice: each copy lag deliveries after the
// first.
func twice(all []string, lag int) []string {
	out := make([]string, 0, 2*len(all))
	for i, id := range all {
		out = append(out, id)
		if i >= lag {
			out = append(out, all[i-lag])
		}
	}
	return append(out, all[max(0, len(all)-lag):]...)
}

// quietRedis drops go-redis's own log lines (dial failures while the
// master is down, the Sentinel's new master), which every failover prints
// by the dozen.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

func init() { redis.SetLogger(quietRedis{}) }

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
// not asserted: Redis replicates asynchronously, and an attempt killed
// between its effect and its completion is run again by the next one.
func TestRedisSentinelFailover(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c := ownservice.Start(t, "redis-ha")
	opt, err := redis.ParseFailoverURL(c.URL)
	if err != nil {
		t.Fatal(err)
	}
	opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = time.Second, time.Second, time.Second
	client := redis.NewFailoverClient(opt)
	defer client.Close()
	sentinel := redis.NewSentinelClient(&redis.Options{Addr: opt.SentinelAddrs[0]})
	defer sentinel.Close()
	store, err := idemredis.New(client, &idemredis.Config{Prefix: "failover:"})
	if err != nil {
		t.Fatal(err)
	}
	logs := &riskLog{}
	consumer, err := idem.NewLeaseConsumer(store, idem.Config{
		Name: "failover", PurgeInterval: -1, Logger: slog.New(logs), Lease: 2 * time.Second, StoreTimeout: 2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	checkRiskWarning(t, logs, store, "1 replica(s) replicate asynchronously")
	var mu sync.Mutex
	effects := map[string]int{}
	process := func(ctx context.Context, id string) error {
		_, err := consumer.Process(ctx, idem.Message{ID: id, Payload: []byte(id)},
			func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
				mu.Lock()
				effects[id]++
				mu.Unlock()
				return idem.Result{}, nil
			})
		return err
	}
	failover := func(killed func()) (func() error, error) {
		addr, err := sentinel.GetMasterAddrByName(ctx, opt.MasterName).Result()
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
	var m matrix
	n := messages(t)
	for r := range rounds(t) {
		all := ids(r, n)
		res := round{deliveries: twice(all, n/4), process: process, killAt: n / 3, failover: failover}.run(ctx, t)
		mu.Lock()
		doubles, lost := m.add(res, all, effects)
		mu.Unlock()
		t.Logf("round %d: %d doubles, %d lost, recovered in %v", r, doubles, lost, res.recover)
		if lost != 0 {
			t.Errorf("round %d: %d messages acknowledged without their effect", r, lost)
		}
	}
	t.Logf("Redis Sentinel, no WAIT: %v", &m)
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

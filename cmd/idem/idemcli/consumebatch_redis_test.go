package idemcli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemredisstream"
	"github.com/idem-go/idem/internal/testenv"
)

// TestConsumeBatchClaimRedisStreams: `idem consume --concurrency 3 --hold
// 12` on Redis Streams, with --batch-claim and without, delivers every
// message once, never more than three calls at a time, with a record per
// message, every entry acknowledged; a message the service refuses is
// dead-lettered, not retried: the same outcomes on both paths. With
// --batch-claim the claims go to the store in batches (fewer acquire
// round trips than claims); the store round trips per message of both
// are logged.
func TestConsumeBatchClaimRedisStreams(t *testing.T) {
	t.Parallel()
	base := serviceURL(t, "IDEM_TEST_REDIS_URL")
	for _, mode := range []struct {
		name  string
		extra []string
	}{{"single", nil}, {"batch-claim", []string{"--batch-claim"}}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			const n, concurrency, hold, group = 40, 3, 12, "g"
			opts, err := redis.ParseURL(base)
			if err != nil {
				t.Fatal(err)
			}
			rdb := redis.NewClient(opts)
			from := fmt.Sprintf("idemtest-cb-%s-%d", mode.name, time.Now().UnixNano())
			dead := from + "-dead"
			ctx := context.Background()
			t.Cleanup(func() { rdb.Del(context.Background(), from, dead); rdb.Close() })
			prod := idemredisstream.NewProducer(rdb, idemredisstream.ProducerConfig{})
			for i := range n {
				if _, err := prod.Publish(ctx, from, []byte("p"), idemredisstream.WithMessageID(fmt.Sprintf("m-%02d", i))); err != nil {
					t.Fatal(err)
				}
			}

			calls := &callLog{}
			svc := refusingService(t, calls, "m-07")

			dir := t.TempDir()
			storePath, stats := filepath.Join(dir, "c.db"), filepath.Join(dir, "memstats")
			rctx, cancel := context.WithCancel(ctx)
			defer cancel()
			args := append([]string{"--broker", base, "--from", from, "--to", svc.URL + "/in", "--group", group,
				"--store", "sqlite:" + storePath, "--log-level", "warn", "--memstats", stats,
				"--concurrency", fmt.Sprint(concurrency), "--hold", fmt.Sprint(hold)}, mode.extra...)
			stderr, done := startConsume(rctx, args...)
			testenv.Eventually(t, 60*time.Second, "every message called and acknowledged, the refused one dead-lettered",
				func() bool {
					d, _ := calls.snapshot()
					p, err := rdb.XPending(ctx, from, group).Result()
					return d == n && err == nil && p.Count == 0 && rdb.XLen(ctx, dead).Val() == 1
				},
				func() string {
					d, c := calls.snapshot()
					return fmt.Sprintf("%d messages called, %d calls\n%s", d, c, stderr())
				})
			stopConsume(t, cancel, done, stderr, calls, n, concurrency)
			wantRecords(t, storePath, n)
			dl, err := rdb.XRange(ctx, dead, "-", "+").Result()
			if err != nil || len(dl) != 1 || dl[0].Values[idemredisstream.DefaultIDField] != "m-07" ||
				dl[0].Values[idem.HeaderDeadLetterReason] != idem.ReasonPermanent {
				t.Errorf("dead letters %v (%v); want m-07, reason %s", dl, err, idem.ReasonPermanent)
			}

			st := readMemStats(t, stats)
			t.Logf("%s: %d messages: acquire %d calls in %d round trips, complete %d in %d: %.2f store round trips per message",
				mode.name, n, st["acquire_calls"], st["acquire_round_trips"], st["complete_calls"], st["complete_round_trips"],
				float64(st["store_round_trips"])/n)
			if mode.extra != nil && st["acquire_round_trips"] >= st["acquire_calls"] {
				t.Errorf("--batch-claim: %d claims in %d acquire round trips; want batches", st["acquire_calls"], st["acquire_round_trips"])
			}
		})
	}
}

// readMemStats reads the counters of a --memstats file, by name (the
// lines with one number).
func readMemStats(t *testing.T, path string) map[string]uint64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 {
			if v, err := strconv.ParseUint(f[1], 10, 64); err == nil {
				out[f[0]] = v
			}
		}
	}
	return out
}

package idemredisstream_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"github.com/idem-go/idem/internal/testenv"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// testURL returns the Redis URL, skipping the test when it is not set
// (failing it under IDEM_TEST_REQUIRE_ALL=1).
func testURL(tb testing.TB) string {
	tb.Helper()
	return testenv.URL(tb, testenv.RedisEnv, "redis://127.0.0.1:6379/0")
}

// newClient returns a client of its own on the test Redis; the caller
// closes it.
func newClient(tb testing.TB) *redis.Client {
	tb.Helper()
	opts, err := redis.ParseURL(testURL(tb))
	if err != nil {
		tb.Fatalf("parse %s: %v", testenv.RedisEnv, err)
	}
	return redis.NewClient(opts)
}

// client returns a client closed at cleanup.
func client(tb testing.TB) *redis.Client {
	tb.Helper()
	c := newClient(tb)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// keys returns fresh stream and dead-letter stream names, deleted at
// cleanup.
func keys(tb testing.TB) (stream, dead string) {
	tb.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	base := "idem-test:{" + hex.EncodeToString(b[:]) + "}"
	stream, dead = base+":stream", base+":dead"
	url := testURL(tb)
	tb.Cleanup(func() {
		opts, err := redis.ParseURL(url)
		if err != nil {
			return
		}
		c := redis.NewClient(opts)
		defer c.Close()
		c.Del(context.Background(), stream, dead)
	})
	return stream, dead
}

func quiet() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// reclaimSlack is how much sooner than its idle time allows an entry may
// look reclaimed: Redis counts idle time in milliseconds, on its own clock.
const reclaimSlack = 50 * time.Millisecond

// minPendingIdle is the smallest idle time, by Redis's clock, of group's
// entries in flight (XPENDING); it fails the test if there are none.
func minPendingIdle(tb testing.TB, rdb *redis.Client, stream, group string) time.Duration {
	tb.Helper()
	ps, err := rdb.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: stream, Group: group, Start: "-", End: "+", Count: 1 << 20}).Result()
	if err != nil {
		tb.Fatal(err)
	}
	if len(ps) == 0 {
		tb.Fatalf("no entry of group %q in flight", group)
	}
	least := ps[0].Idle
	for _, p := range ps[1:] {
		least = min(least, p.Idle)
	}
	return least
}

// pendingCount returns the number of pending entries of the group.
func pendingCount(tb testing.TB, rdb *redis.Client, stream, group string) int64 {
	tb.Helper()
	p, err := rdb.XPending(context.Background(), stream, group).Result()
	if err != nil {
		tb.Fatal(err)
	}
	return p.Count
}

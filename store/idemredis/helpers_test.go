package idemredis_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/idemredis"
	"github.com/redis/go-redis/v9"
)

// newClient opens a client on the test Redis (testenv.RedisEnv), closed at
// cleanup; the test skips without it, or fails under
// IDEM_TEST_REQUIRE_ALL=1.
func newClient(tb testing.TB) *redis.Client {
	tb.Helper()
	u := testenv.URL(tb, testenv.RedisEnv, "redis://127.0.0.1:6379/0")
	opts, err := redis.ParseURL(u)
	if err != nil {
		tb.Fatalf("parse %s: %v", testenv.RedisEnv, err)
	}
	c := redis.NewClient(opts)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// uniquePrefix returns a key prefix no other test uses.
func uniquePrefix(tb testing.TB) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "idemtest:" + hex.EncodeToString(b[:]) + ":"
}

// testBundle is one test's store on a prefix of its own.
type testBundle struct {
	client redis.UniversalClient
	store  *idemredis.Store
	prefix string
	ctx    context.Context
}

// setup returns a Store on client (nil: a new client on the test Redis)
// under a fresh prefix whose keys are deleted at cleanup.
func setup(tb testing.TB, client redis.UniversalClient) *testBundle {
	tb.Helper()
	return setupWith(tb, client, idemredis.Config{})
}

// setupWith is setup with cfg (its Prefix replaced by a fresh one).
func setupWith(tb testing.TB, client redis.UniversalClient, cfg idemredis.Config) *testBundle {
	tb.Helper()
	if client == nil {
		client = newClient(tb)
	}
	prefix := uniquePrefix(tb)
	cfg.Prefix = prefix
	store, err := idemredis.New(client, &cfg)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := store.DeleteAll(ctx); err != nil {
			tb.Errorf("cleanup of %s*: %v", prefix, err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	tb.Cleanup(cancel)
	return &testBundle{client: client, store: store, prefix: prefix, ctx: ctx}
}

package idemcli

import (
	"context"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/cmd/idem/internal/connect"
	"github.com/idem-go/idem/store/idemredis"
)

// isRedisURL reports whether rawURL names a Redis store (redis:// or
// rediss://, TLS).
func isRedisURL(rawURL string) bool {
	scheme, _, _ := strings.Cut(rawURL, ":")
	s := strings.ToLower(scheme)
	return s == "redis" || s == "rediss"
}

// redisStore is an opened Redis store and its client.
type redisStore struct {
	client *redis.Client
	store  *idemredis.Store
	// where names the server for messages, without credentials.
	where string
}

// openRedisStore opens the lease-mode store on the Redis at rawURL under
// the key prefix, once the server answers a ping (connect.RedisStore: its
// errors never hold the password).
func openRedisStore(ctx context.Context, rawURL, prefix string) (*redisStore, error) {
	client, opts, err := connect.RedisStore(ctx, rawURL)
	if err != nil {
		return nil, err
	}
	st, err := idemredis.New(client, &idemredis.Config{Prefix: prefix})
	if err != nil {
		client.Close()
		return nil, err
	}
	return &redisStore{client: client, store: st, where: "redis at " + opts.Addr}, nil
}

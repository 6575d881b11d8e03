//go:build !nodemo

package demo

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/connect"
	"github.com/idem-go/idem/cmd/idem/internal/secret"
	"github.com/idem-go/idem/store/idemredis"
)

// demoRedisPrefix starts every key the demo writes in Redis.
const demoRedisPrefix = "idem-demo:"

// openRedisLease opens the lease-mode store on the Redis at rawURL and a
// LeaseConsumer over it, with hooks; closing the consumer closes the
// client. fresh deletes what an earlier demo left there.
func openRedisLease(ctx context.Context, rawURL string, fresh bool, hooks []idem.Hook) (_ *redisLease, _ string, err error) {
	defer func() { err = secret.Error(err, rawURL) }()
	client, opts, err := connect.RedisStore(ctx, rawURL)
	if err != nil {
		return nil, "", err
	}
	where := "redis at " + opts.Addr
	if fresh {
		iter := client.Scan(ctx, 0, demoRedisPrefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			if err := client.Del(ctx, iter.Val()).Err(); err != nil {
				client.Close()
				return nil, "", err
			}
		}
		if err := iter.Err(); err != nil {
			client.Close()
			return nil, "", err
		}
	}
	store, err := idemredis.New(client, &idemredis.Config{Prefix: demoRedisPrefix})
	if err != nil {
		client.Close()
		return nil, "", err
	}
	l := &redisLease{client: client}
	for name, lc := range map[string]**idem.LeaseConsumer{demoConsumer: &l.LeaseConsumer, receiptsConsumer: &l.receipts} {
		if *lc, err = idem.NewLeaseConsumer(store, idem.Config{Name: name, Lease: 10 * time.Second, PurgeInterval: -1, Hooks: hooks}); err != nil {
			l.Close()
			return nil, "", err
		}
	}
	return l, where, nil
}

// redisLease is the payments LeaseConsumer, with the receipts one, over
// the Redis client it owns.
type redisLease struct {
	*idem.LeaseConsumer
	receipts *idem.LeaseConsumer
	client   *redis.Client
}

// Close stops the consumers and closes the client.
func (l *redisLease) Close() error {
	for _, c := range []*idem.LeaseConsumer{l.LeaseConsumer, l.receipts} {
		if c != nil {
			c.Close()
		}
	}
	return l.client.Close()
}

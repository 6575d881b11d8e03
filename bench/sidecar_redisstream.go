package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Fields of a --sidecar Redis Streams entry: those idemredisstream's
// Producer writes and its Consumer reads by default (DefaultIDField,
// DefaultPayloadField).
const (
	streamIDField      = "message-id"
	streamPayloadField = "payload"
)

// redisStreamBus is --sidecar on Redis Streams (envSidecarBroker=redis),
// on the Redis that envRedis names: a stream per run, the bare relay over
// go-redis, and that Redis as idem consume's --broker.
type redisStreamBus struct {
	redisURL string
	rdb      *redis.Client
}

func newRedisStreamBus(redisURL string) (*redisStreamBus, error) {
	opts, err := redis.ParseURL(redisURL)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", envRedis, err)
	}
	return &redisStreamBus{redisURL: redisURL, rdb: redis.NewClient(opts)}, nil
}

func (b *redisStreamBus) url() string { return b.redisURL }
func (b *redisStreamBus) close()      { _ = b.rdb.Close() }

// publish appends n entries (XADD, pipelined 500 at a time) to the run's
// stream, each with its ID and the payload in the default fields;
// cleanup deletes the stream and its dead letter (idem consume's default,
// STREAM-dead).
func (b *redisStreamBus) publish(ctx context.Context, tag string, n int, payload []byte) (stream, subject string, cleanup func(), err error) {
	stream = "bench-stream:" + tag
	cleanup = func() { b.rdb.Del(context.WithoutCancel(ctx), stream, stream+"-dead") }
	for from := 0; from < n; from += 500 {
		pipe := b.rdb.Pipeline()
		for i := from; i < min(n, from+500); i++ {
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: stream,
				Values: []any{streamIDField, fmt.Sprintf("%s-%d", tag, i), streamPayloadField, payload}})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			cleanup()
			return "", "", nil, fmt.Errorf("XADD: %w", err)
		}
	}
	return stream, stream, cleanup, nil
}

// bareRelay is the Redis Streams contender that only moves entries: a
// consumer group member that reads 64 entries at a time (XREADGROUP
// COUNT 64), concurrency workers that POST each with its ID as
// Idempotency-Key and XACK it after a 2xx.
func (b *redisStreamBus) bareRelay(concurrency int) func(ctx context.Context, stream, subject, url, tag string) (func() usage, error) {
	return func(ctx context.Context, stream, _, url, tag string) (func() usage, error) {
		group := "bare-" + tag
		if err := b.rdb.XGroupCreateMkStream(ctx, stream, group, "0").Err(); err != nil {
			return nil, fmt.Errorf("XGROUP CREATE: %w", err)
		}
		ctx, cancel := context.WithCancel(ctx)
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: concurrency}}
		work := make(chan redis.XMessage)
		var wg sync.WaitGroup
		for range concurrency {
			wg.Go(func() {
				for m := range work {
					payload, _ := m.Values[streamPayloadField].(string)
					req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(payload))
					if err != nil {
						continue
					}
					id, _ := m.Values[streamIDField].(string)
					req.Header.Set("Idempotency-Key", id)
					resp, err := client.Do(req)
					if err != nil {
						continue // left pending
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode/100 == 2 {
						_ = b.rdb.XAck(ctx, stream, group, m.ID).Err()
					}
				}
			})
		}
		wg.Go(func() {
			defer close(work)
			for ctx.Err() == nil {
				res, err := b.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "bare",
					Streams: []string{stream, ">"}, Count: 64, Block: time.Second}).Result()
				if err != nil {
					continue // redis.Nil: nothing new within the block
				}
				for _, s := range res {
					for _, m := range s.Messages {
						select {
						case work <- m:
						case <-ctx.Done():
							return
						}
					}
				}
			}
		})
		return func() usage { cancel(); wg.Wait(); client.CloseIdleConnections(); return usage{} }, nil
	}
}

package idemcli

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// The demo's Redis Streams names. The message ID travels in a field.
const (
	redisStream     = "idem-demo-stream:payments"
	redisDeadStream = "idem-demo-stream:payments-dead"
	redisGroup      = "payments"
	redisIDField    = "message-id"
)

// redisStreamBroker carries the demo's messages on a Redis stream with a
// consumer group. A consumer that dies leaves its entries pending; after
// the ack wait another consumer claims them with XAUTOCLAIM.
type redisStreamBroker struct {
	client  *redis.Client
	ackWait time.Duration
	workers atomic.Int64
}

func openRedisStreams(ctx context.Context, url string, ackWait time.Duration, fresh bool) (*redisStreamBroker, error) {
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("%w: broker %q: %v", errBadURL, redact(url), err)
	}
	b := &redisStreamBroker{client: redis.NewClient(opts), ackWait: ackWait}
	if err := b.client.Ping(ctx).Err(); err != nil {
		b.close()
		return nil, fmt.Errorf("cannot reach Redis at %s: %w", opts.Addr, err)
	}
	if fresh {
		if err := b.client.Del(ctx, redisStream, redisDeadStream).Err(); err != nil {
			b.close()
			return nil, err
		}
	}
	err = b.client.XGroupCreateMkStream(ctx, redisStream, redisGroup, "0").Err()
	if err != nil && err.Error() != "BUSYGROUP Consumer Group name already exists" {
		b.close()
		return nil, fmt.Errorf("Redis: create the consumer group: %w", err)
	}
	return b, nil
}

func (b *redisStreamBroker) publish(ctx context.Context, id string, payload []byte) (bool, error) {
	return false, b.client.XAdd(ctx, &redis.XAddArgs{Stream: redisStream,
		Values: []any{redisIDField, id, "payload", payload}}).Err()
}

func (b *redisStreamBroker) deadLetter(ctx context.Context, d delivery, reason error) error {
	return b.client.XAdd(ctx, &redis.XAddArgs{Stream: redisDeadStream,
		Values: []any{redisIDField, d.id(), "payload", d.payload(), "reason", reason.Error()}}).Err()
}

func (b *redisStreamBroker) worker(context.Context) (demoWorker, error) {
	return &redisStreamWorker{b: b, name: fmt.Sprintf("consumer-%d-%d", time.Now().UnixNano(), b.workers.Add(1))}, nil
}

// unfinished is the group's pending entries plus those not yet delivered.
func (b *redisStreamBroker) unfinished(ctx context.Context) (int, error) {
	groups, err := b.client.XInfoGroups(ctx, redisStream).Result()
	if err != nil {
		return 0, err
	}
	for _, g := range groups {
		if g.Name == redisGroup {
			if g.Lag < 0 {
				return 0, errors.New("Redis cannot tell the group's lag")
			}
			return int(g.Pending + g.Lag), nil
		}
	}
	return 0, errors.New("the demo's consumer group is gone")
}

func (b *redisStreamBroker) close() { b.client.Close() }

type redisStreamWorker struct {
	b    *redisStreamBroker
	name string
}

// fetch first claims entries left pending longer than the ack wait by a
// consumer that died, then reads new ones.
func (w *redisStreamWorker) fetch(ctx context.Context, n int, maxWait time.Duration) ([]delivery, error) {
	var out []delivery
	claimed, _, err := w.b.client.XAutoClaim(ctx, &redis.XAutoClaimArgs{Stream: redisStream, Group: redisGroup,
		MinIdle: w.b.ackWait, Start: "0", Count: int64(n), Consumer: w.name}).Result()
	if err != nil {
		return nil, err
	}
	for _, m := range claimed {
		out = append(out, redisStreamDelivery{w.b, m})
	}
	if len(out) > 0 {
		return out, nil
	}
	streams, err := w.b.client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: redisGroup, Consumer: w.name,
		Streams: []string{redisStream, ">"}, Count: int64(n), Block: maxWait}).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	for _, s := range streams {
		for _, m := range s.Messages {
			out = append(out, redisStreamDelivery{w.b, m})
		}
	}
	return out, nil
}

func (w *redisStreamWorker) batchDone(context.Context) {}

// crash walks away: its entries stay pending until XAUTOCLAIM takes them.
func (w *redisStreamWorker) crash() {}
func (w *redisStreamWorker) close() {}

type redisStreamDelivery struct {
	b *redisStreamBroker
	m redis.XMessage
}

func (d redisStreamDelivery) id() string {
	s, _ := d.m.Values[redisIDField].(string)
	return s
}

func (d redisStreamDelivery) payload() []byte {
	s, _ := d.m.Values["payload"].(string)
	return []byte(s)
}

func (d redisStreamDelivery) ack() error {
	return d.b.client.XAck(context.Background(), redisStream, redisGroup, d.m.ID).Err()
}

// retryAfter leaves the entry pending: XAUTOCLAIM redelivers it after the
// ack wait.
func (d redisStreamDelivery) retryAfter(time.Duration) error { return nil }
func (d redisStreamDelivery) settle() error                  { return d.ack() }

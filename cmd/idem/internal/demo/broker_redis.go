//go:build !nodemo

package demo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemredisstream"
	"github.com/idem-go/idem/cmd/idem/internal/connect"
)

// The demo's Redis Streams names. The message ID travels in idemredisstream's
// message-id field.
const (
	redisStream     = "idem-demo-stream:payments"
	redisDeadStream = "idem-demo-stream:payments-dead"
	redisGroup      = "payments"
	// The receipts story: PaymentCharged events, sent by the outbox relay.
	redisEventsStream  = "idem-demo-stream:payments-charged"
	redisReceiptsGroup = "receipts"
)

// redisStreamBroker carries the demo's messages on a Redis stream with a
// consumer group, through idemredisstream. Each member has a client of its
// own; a member that dies closes it and leaves its entries pending, and
// after the ack wait another member claims them with XAUTOCLAIM.
type redisStreamBroker struct {
	opts    *redis.Options
	client  *redis.Client
	prod    *idemredisstream.Producer
	ackWait time.Duration
	members atomic.Int64
}

func openRedisStreams(ctx context.Context, url string, ackWait time.Duration, fresh bool) (*redisStreamBroker, error) {
	client, opts, err := connect.Redis(ctx, url)
	if err != nil {
		return nil, err
	}
	b := &redisStreamBroker{opts: opts, client: client, ackWait: ackWait}
	b.prod = idemredisstream.NewProducer(b.client, idemredisstream.ProducerConfig{})
	if fresh {
		if err := b.client.Del(ctx, redisStream, redisDeadStream, redisEventsStream).Err(); err != nil {
			b.close()
			return nil, err
		}
	}
	return b, nil
}

func (b *redisStreamBroker) publish(ctx context.Context, id string, payload []byte) (bool, error) {
	_, err := b.prod.Publish(ctx, redisStream, payload, idemredisstream.WithMessageID(id))
	return false, err
}

// member reads as a new group member on a client of its own, which its
// crash closes.
func (b *redisStreamBroker) member(_ context.Context, p idem.Processor, log *slog.Logger) (*member, error) {
	return b.join(redisStream, redisGroup, p, log)
}

// join reads stream as a new member of group, on a client of its own.
func (b *redisStreamBroker) join(stream, group string, p idem.Processor, log *slog.Logger) (*member, error) {
	rdb := redis.NewClient(b.opts)
	c, err := idemredisstream.NewConsumer(rdb, idemredisstream.Config{
		Processor: p, Stream: stream, Group: group, DeadLetter: redisDeadStream,
		Consumer: fmt.Sprintf("demo-%d-%d", os.Getpid(), b.members.Add(1)),
		MinIdle:  b.ackWait, RetryDelay: demoRetryDelay, Block: 250 * time.Millisecond, Logger: log,
	})
	if err != nil {
		rdb.Close()
		return nil, err
	}
	return &member{run: c.Run, shutdown: func() { rdb.Close() }}, nil
}

// unfinished is the group's pending entries plus those not yet delivered.
func (b *redisStreamBroker) unfinished(ctx context.Context) (int, error) {
	return b.lag(ctx, redisStream, redisGroup)
}

// lag is group's pending entries on stream plus those not yet delivered.
func (b *redisStreamBroker) lag(ctx context.Context, stream, group string) (int, error) {
	groups, err := b.client.XInfoGroups(ctx, stream).Result()
	if err != nil {
		return 0, err
	}
	for _, g := range groups {
		if g.Name == group {
			if g.Lag < 0 {
				return 0, errors.New("Redis cannot tell the group's lag")
			}
			return int(g.Pending + g.Lag), nil
		}
	}
	return 0, errors.New("the demo's consumer group does not exist yet")
}

func (b *redisStreamBroker) deadLettered(ctx context.Context) (int64, error) {
	return b.client.XLen(ctx, redisDeadStream).Result()
}

func (b *redisStreamBroker) close() { b.client.Close() }

// eventsDestination is the stream of the PaymentCharged events.
func (b *redisStreamBroker) eventsDestination() string { return redisEventsStream }

// eventsPublisher is the relay's Redis Streams publisher (XADD with the
// message-id field), on the broker's client.
func (b *redisStreamBroker) eventsPublisher(context.Context) (idem.Publisher, error) {
	return idemredisstream.NewPublisher(b.client, idemredisstream.ProducerConfig{}), nil
}

// receiptsMember reads the events stream in the receipts group.
func (b *redisStreamBroker) receiptsMember(_ context.Context, p idem.Processor, log *slog.Logger) (*member, error) {
	return b.join(redisEventsStream, redisReceiptsGroup, p, log)
}

func (b *redisStreamBroker) eventsUnfinished(ctx context.Context) (int, error) {
	return b.lag(ctx, redisEventsStream, redisReceiptsGroup)
}

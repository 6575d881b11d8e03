package idemredisstream_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/broker/idemredisstream"
	"github.com/redis/go-redis/v9"
)

// streamBroker is the brokertest.Broker of one stream, its consumer group
// and its dead-letter stream on the test Redis.
type streamBroker struct {
	t        *testing.T
	rdb      *redis.Client
	stream   string
	dead     string
	producer *idemredisstream.Producer
	members  atomic.Int64
}

const testGroup = "conformance"

func newStreamBroker(t *testing.T) brokertest.Broker {
	rdb := client(t)
	stream, dead := keys(t)
	return &streamBroker{t: t, rdb: rdb, stream: stream, dead: dead,
		producer: idemredisstream.NewProducer(rdb, idemredisstream.ProducerConfig{})}
}

func (b *streamBroker) Publish(ctx context.Context, id string, payload []byte) error {
	if idem.ValidateMessageID(id, 0) != nil {
		// No ID, or one the Producer refuses: written as is (no field at
		// all when empty), for the consumer to dead-letter.
		values := []any{idemredisstream.DefaultPayloadField, payload}
		if id != "" {
			values = append(values, idemredisstream.DefaultIDField, id)
		}
		return b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: values}).Err()
	}
	_, err := b.producer.Publish(ctx, b.stream, payload, idemredisstream.WithMessageID(id))
	return err
}

var _ brokertest.BatchBroker = (*streamBroker)(nil)

// newConsumer returns a new member of the group on a client of its own.
func (b *streamBroker) newConsumer(p idem.Processor, opts brokertest.StartOptions) (*redis.Client, *idemredisstream.Consumer, error) {
	return b.newConsumerOf(p, nil, opts)
}

// newConsumerOf is newConsumer with p or, in batch mode, bp (batches of at
// most opts.BatchSize entries).
func (b *streamBroker) newConsumerOf(p idem.Processor, bp idem.BatchProcessor, opts brokertest.StartOptions) (*redis.Client, *idemredisstream.Consumer, error) {
	rdb := newClient(b.t)
	redelivery := max(opts.Redelivery, 100*time.Millisecond)
	c, err := idemredisstream.NewConsumer(rdb, idemredisstream.Config{
		Processor:      p,
		BatchProcessor: bp,
		BatchSize:      opts.BatchSize,
		Stream:         b.stream,
		Group:          testGroup,
		Consumer:       fmt.Sprint("member-", b.members.Add(1)),
		DeadLetter:     b.dead,
		Concurrency:    max(opts.Concurrency, 1),
		MinIdle:        redelivery,
		RetryDelay:     redelivery / 4,
		Block:          200 * time.Millisecond,
		Logger:         quiet(),
		HandlerTimeout: opts.HandlerTimeout,
	})
	if err != nil {
		_ = rdb.Close()
		return nil, nil, err
	}
	return rdb, c, nil
}

// NewConsumer implements brokertest.Broker: the Consumer, on a client of its
// own closed at cleanup.
func (b *streamBroker) NewConsumer(p idem.Processor, opts brokertest.StartOptions) (brokertest.Runner, error) {
	rdb, c, err := b.newConsumer(p, opts)
	if err != nil {
		return nil, err
	}
	b.t.Cleanup(func() { _ = rdb.Close() })
	return c, nil
}

func (b *streamBroker) Start(ctx context.Context, p idem.Processor, opts brokertest.StartOptions) (brokertest.Member, error) {
	rdb, c, err := b.newConsumer(p, opts)
	if err != nil {
		return nil, err
	}
	return b.start(ctx, rdb, c)
}

// StartBatch implements brokertest.BatchBroker: the Consumer in batch mode
// (Config.BatchProcessor), at most opts.BatchSize entries a batch.
func (b *streamBroker) StartBatch(ctx context.Context, p idem.BatchProcessor, opts brokertest.StartOptions) (brokertest.Member, error) {
	rdb, c, err := b.newConsumerOf(nil, p, opts)
	if err != nil {
		return nil, err
	}
	return b.start(ctx, rdb, c)
}

// start runs c (on client rdb) as a member, once it reads.
func (b *streamBroker) start(ctx context.Context, rdb *redis.Client, c *idemredisstream.Consumer) (brokertest.Member, error) {
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m := &streamMember{rdb: rdb, c: c, cancel: cancel, done: make(chan error, 1)}
	go func() { m.done <- c.Run(runCtx) }()
	select {
	case <-c.Ready():
	case err := <-m.done:
		cancel()
		_ = rdb.Close()
		return nil, fmt.Errorf("consumer ended before reading: %v", err)
	case <-ctx.Done():
		cancel()
		_ = rdb.Close()
		return nil, ctx.Err()
	}
	b.t.Cleanup(m.Crash)
	return m, nil
}

func (b *streamBroker) DeadLetters(ctx context.Context) ([]brokertest.DeadLetter, error) {
	return readDeadLetters(ctx, b.rdb, b.dead)
}

func readDeadLetters(ctx context.Context, rdb *redis.Client, dead string) ([]brokertest.DeadLetter, error) {
	entries, err := rdb.XRange(ctx, dead, "-", "+").Result()
	if err != nil {
		return nil, err
	}
	out := make([]brokertest.DeadLetter, 0, len(entries))
	for _, e := range entries {
		id, _ := e.Values[idemredisstream.DefaultIDField].(string)
		payload, _ := e.Values[idemredisstream.DefaultPayloadField].(string)
		reason, _ := e.Values[idem.HeaderDeadLetterReason].(string)
		text, _ := e.Values[idem.HeaderDeadLetterError].(string)
		out = append(out, brokertest.DeadLetter{ID: id, Payload: []byte(payload), Reason: reason, Error: text})
	}
	return out, nil
}

type streamMember struct {
	rdb    *redis.Client
	c      *idemredisstream.Consumer
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

func (m *streamMember) Stop(ctx context.Context) error {
	err := m.c.Stop(ctx)
	m.once.Do(func() {
		m.cancel()
		_ = m.rdb.Close()
	})
	return err
}

// Crash closes the member's client, as a killed process would: no XACK
// reaches Redis any more, and its pending entries wait for another
// member's XAUTOCLAIM.
func (m *streamMember) Crash() {
	m.once.Do(func() {
		_ = m.rdb.Close()
		m.cancel()
	})
}

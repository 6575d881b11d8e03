package gocdktest

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/broker/idemgocdk"
	"gocloud.dev/pubsub"
)

// channel is one isolated topic of a Go CDK service with the subscription
// its consumers share, and a dead-letter topic with a subscription that
// reads it.
type channel struct {
	// topic is where messages are published.
	topic *pubsub.Topic
	// dead is the topic consumers send dead letters to; deadSub reads it.
	dead    *pubsub.Topic
	deadSub *pubsub.Subscription
	// member opens one member's own Subscription of the shared
	// subscription.
	member func(t *testing.T) memberSub
	// system is the messaging.system the members report.
	system string
}

// memberSub is one member's Subscription and what cuts it off.
type memberSub struct {
	sub *pubsub.Subscription
	// crash cuts the member off: from its call on, nothing of it (no ack,
	// no nack) reaches the service. It also releases the member's
	// connection, if it has one of its own, after Shutdown.
	crash func()
	// quiesce, when set, makes the Subscription fetch no more messages:
	// the harness calls it before a graceful Stop (see drain).
	quiesce func()
}

// drain receives what sub still holds, or is fetching, until it has
// nothing for 300ms, then settles each message it got with settle. The Go
// CDK (v0.49.0) parks the goroutine of a fetch whose Receive gave up (a
// Stop, a context ended) until the Subscription's next Receive, even
// through Shutdown: a Receive that drains lets it go. The messages are
// settled only at the end, so that a nack's immediate redelivery does not
// keep the drain going.
func drain(sub *pubsub.Subscription, settle func(*pubsub.Message)) {
	var got []*pubsub.Message
	defer func() {
		for _, m := range got {
			settle(m)
		}
	}()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		m, err := sub.Receive(ctx)
		cancel()
		if err != nil {
			return
		}
		got = append(got, m)
	}
}

// cdkBroker is the brokertest.Broker of one channel, seen through
// idemgocdk.
type cdkBroker struct {
	t        *testing.T
	ch       channel
	producer *idemgocdk.Producer

	deadMu sync.Mutex
	deadls []brokertest.DeadLetter
}

func newCDKBroker(t *testing.T, ch channel) *cdkBroker {
	return &cdkBroker{t: t, ch: ch, producer: idemgocdk.NewProducer(idemgocdk.ProducerConfig{})}
}

// quiet is the members' logger: settlements are what the suite checks.
func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// Publish sends through the Producer; an ID the Producer refuses (none,
// or one idem rejects) is sent as is, without the key when empty, for the
// consumer to dead-letter.
func (b *cdkBroker) Publish(ctx context.Context, id string, payload []byte) error {
	if idem.ValidateMessageID(id, 0) != nil {
		var md map[string]string
		if id != "" {
			md = map[string]string{idemgocdk.DefaultIDKey: id}
		}
		return b.ch.topic.Send(ctx, &pubsub.Message{Body: payload, Metadata: md})
	}
	_, err := b.producer.Send(ctx, b.ch.topic, &pubsub.Message{Body: payload}, id)
	return err
}

// newConsumer returns a member's Consumer on a Subscription of its own.
func (b *cdkBroker) newConsumer(p idem.Processor, opts brokertest.StartOptions) (*cdkMember, error) {
	ms := b.ch.member(b.t)
	// Below the ack deadline, which the channel fixed when it was created
	// (brokertest's usual Redelivery, 1s).
	retry := max(opts.Redelivery, 100*time.Millisecond) / 4
	c, err := idemgocdk.NewConsumer(ms.sub, idemgocdk.Config{
		Processor:      p,
		DeadLetter:     b.ch.dead,
		Concurrency:    max(opts.Concurrency, 1),
		RetryDelay:     retry,
		System:         b.ch.system,
		Logger:         quiet(),
		HandlerTimeout: opts.HandlerTimeout,
	})
	if err != nil {
		ms.crash()
		_ = ms.sub.Shutdown(context.Background())
		return nil, err
	}
	return &cdkMember{memberSub: ms, c: c, done: make(chan error, 1)}, nil
}

// NewConsumer implements brokertest.Broker: the Consumer, on a
// Subscription of its own shut down at cleanup.
func (b *cdkBroker) NewConsumer(p idem.Processor, opts brokertest.StartOptions) (brokertest.Runner, error) {
	m, err := b.newConsumer(p, opts)
	if err != nil {
		return nil, err
	}
	b.t.Cleanup(func() { m.shutdown(context.Background()) })
	return m.c, nil
}

// Start implements brokertest.Broker: a member running until Stop or Crash.
func (b *cdkBroker) Start(ctx context.Context, p idem.Processor, opts brokertest.StartOptions) (brokertest.Member, error) {
	m, err := b.newConsumer(p, opts)
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m.cancel = cancel
	go func() { m.done <- m.c.Run(runCtx) }()
	b.t.Cleanup(m.Crash)
	return m, nil
}

// DeadLetters implements brokertest.Broker: it reads what the dead-letter
// subscription holds now (acking it) and returns everything read so far.
func (b *cdkBroker) DeadLetters(ctx context.Context) ([]brokertest.DeadLetter, error) {
	b.deadMu.Lock()
	defer b.deadMu.Unlock()
	for {
		rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		m, err := b.ch.deadSub.Receive(rctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if errors.Is(err, context.DeadlineExceeded) {
				break
			}
			return nil, err
		}
		b.deadls = append(b.deadls, brokertest.DeadLetter{
			ID:      m.Metadata[idemgocdk.DefaultIDKey],
			Payload: m.Body,
			Reason:  m.Metadata[idem.HeaderDeadLetterReason],
			Error:   m.Metadata[idem.HeaderDeadLetterError],
		})
		m.Ack()
	}
	return append([]brokertest.DeadLetter(nil), b.deadls...), nil
}

// cdkMember is one running Consumer on its own Subscription.
type cdkMember struct {
	memberSub
	c      *idemgocdk.Consumer
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// Stop stops the Consumer gracefully, then shuts its Subscription down,
// which sends the acks the Go CDK still holds.
func (m *cdkMember) Stop(ctx context.Context) error {
	if m.quiesce != nil {
		m.quiesce()
	}
	err := m.c.Stop(ctx)
	m.shutdown(ctx)
	return err
}

// shutdown ends the member once: its Run, then what its Subscription
// still holds or fetches (nacked), then the Subscription and its
// connection.
func (m *cdkMember) shutdown(ctx context.Context) {
	m.once.Do(func() {
		if m.cancel != nil {
			m.cancel()
		}
		drain(m.sub, func(msg *pubsub.Message) { msg.Nack() })
		_ = m.sub.Shutdown(ctx)
		m.crash()
	})
}

// Crash cuts the member off first, as a killed process is: no ack or nack
// of it reaches the service any more, and what it had not acked is
// redelivered after the ack deadline.
func (m *cdkMember) Crash() {
	m.crash()
	m.shutdown(context.Background())
}

package gocdktest

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"gocloud.dev/gcerrors"
	"gocloud.dev/pubsub"
	"gocloud.dev/pubsub/batcher"
	"gocloud.dev/pubsub/driver"
	"gocloud.dev/pubsub/mempubsub"
)

// oneAtATime makes a Subscription fetch one message per call, so that no
// message waits in its queue while its ack deadline runs out.
var oneAtATime = &batcher.Options{MaxBatchSize: 1, MaxHandlers: 1}

// memChannel is a channel on mempubsub. The subscription is created with
// the channel, before anything is published (a mempubsub topic delivers
// only to the subscriptions it has), so its ack deadline is fixed then.
//
// mempubsub has no connections, so each member gets a Subscription of its
// own through memberConn, a driver that passes on the messages of one
// shared mempubsub Subscription (received by one pump goroutine), and
// their acks and nacks back until the member crashes: the shape of a
// client's connection to a real service.
func memChannel(t *testing.T, ackDeadline time.Duration) channel {
	ctx := context.Background()
	topic := mempubsub.NewTopic()
	shared := mempubsub.NewSubscriptionWithOptions(topic, ackDeadline, &mempubsub.SubscriptionOptions{ReceiveBatcherOptions: *oneAtATime})
	dead := mempubsub.NewTopic()
	deadSub := mempubsub.NewSubscription(dead, time.Minute)
	pumped := make(chan *pubsub.Message)
	pumpCtx, stopPump := context.WithCancel(ctx)
	var pump sync.WaitGroup
	pump.Go(func() {
		for {
			m, err := shared.Receive(pumpCtx)
			if err != nil {
				return
			}
			select {
			case pumped <- m:
			case <-pumpCtx.Done():
				runtime.SetFinalizer(m, nil) // redelivered after the deadline
				return
			}
		}
	})
	t.Cleanup(func() {
		stopPump()
		pump.Wait()
		drain(shared, (*pubsub.Message).Ack)
		_ = topic.Shutdown(ctx)
		_ = shared.Shutdown(ctx)
		_ = dead.Shutdown(ctx)
		drain(deadSub, (*pubsub.Message).Ack)
		_ = deadSub.Shutdown(ctx)
	})
	return channel{topic: topic, dead: dead, deadSub: deadSub, system: "mem",
		member: func(t *testing.T) memberSub {
			conn := &memberConn{pumped: pumped}
			return memberSub{sub: pubsub.NewSubscription(conn, oneAtATime, nil), crash: conn.cut, quiesce: conn.quiesce}
		}}
}

// memberConn is a driver.Subscription that forwards the shared
// subscription's messages to one member, until cut.
type memberConn struct {
	pumped <-chan *pubsub.Message
	mu     sync.Mutex
	isCut  bool
	quiet  bool // passes on no more messages
}

func (c *memberConn) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.isCut, c.quiet = true, true
}

func (c *memberConn) quiesce() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.quiet = true
}

func (c *memberConn) state() (alive, receiving bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.isCut, !c.quiet
}

// ReceiveBatch passes on at most one message, waiting up to 100ms for it.
func (c *memberConn) ReceiveBatch(ctx context.Context, _ int) ([]*driver.Message, error) {
	wait := time.NewTimer(100 * time.Millisecond)
	defer wait.Stop()
	if _, receiving := c.state(); !receiving {
		select { // not at once: the portable type would call again at once
		case <-wait.C:
		case <-ctx.Done():
		}
		return nil, ctx.Err()
	}
	var m *pubsub.Message
	select {
	case m = <-c.pumped:
	case <-wait.C:
		return nil, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if _, receiving := c.state(); !receiving {
		m.Nack() // given back at once, as a stopping client would
		return nil, nil
	}
	return []*driver.Message{{LoggableID: m.LoggableID, Body: m.Body, Metadata: m.Metadata, AckID: m,
		AsFunc: func(any) bool { return false }}}, nil
}

func (c *memberConn) settle(ids []driver.AckID, ack bool) error {
	alive, _ := c.state()
	for _, id := range ids {
		switch m := id.(*pubsub.Message); {
		case !alive:
			// Lost with the member: redelivered after the ack deadline.
			runtime.SetFinalizer(m, nil)
		case ack:
			m.Ack()
		default:
			m.Nack()
		}
	}
	return nil
}
func (c *memberConn) SendAcks(_ context.Context, ids []driver.AckID) error {
	return c.settle(ids, true)
}
func (c *memberConn) SendNacks(_ context.Context, ids []driver.AckID) error {
	return c.settle(ids, false)
}
func (c *memberConn) CanNack() bool                      { return true }
func (c *memberConn) IsRetryable(error) bool             { return false }
func (c *memberConn) As(any) bool                        { return false }
func (c *memberConn) ErrorAs(error, any) bool            { return false }
func (c *memberConn) ErrorCode(error) gcerrors.ErrorCode { return gcerrors.Unknown }
func (c *memberConn) Close() error                       { return nil }

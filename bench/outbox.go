package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
)

// relayCounter is a relay hook (idem.HookRelay) that counts the messages
// sent and notes when the count first reached target.
type relayCounter struct {
	target int64
	sent   atomic.Int64
	once   sync.Once
	done   chan struct{}
	at     time.Time // set before done is closed
}

func newRelayCounter(target int) *relayCounter {
	return &relayCounter{target: int64(target), done: make(chan struct{})}
}

// OnRelay implements idem.HookRelay.
func (c *relayCounter) OnRelay(_ context.Context, e idem.RelayEvent) {
	if c.sent.Add(int64(e.Result.Sent)) >= c.target {
		c.once.Do(func() { c.at = time.Now(); close(c.done) })
	}
}

// outboxRun is the outbox side of one run: the destination the handlers
// emit to and a relay sending to it, running until stop.
type outboxRun struct {
	dest    string
	relay   *idem.Relay
	held    func(context.Context) (int, error)
	counter *relayCounter
	stop    func()
}

// newOutbox creates ch's outgoing destination and a relay from rdb's
// outbox to it, not running yet (see start); target is the count of sent
// messages its counter waits for.
func newOutbox(ctx context.Context, ch channel, rdb runDB, target int) (*outboxRun, error) {
	dest, pub, held, err := ch.outgoing(ctx)
	if err != nil {
		return nil, err
	}
	store := rdb.outbox()
	if store == nil {
		return nil, errors.New("the store has no outbox")
	}
	counter := newRelayCounter(target)
	relay, err := idem.NewRelay(idem.RelayConfig{
		Store: store, Publisher: pub, Hooks: []idem.Hook{counter},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return nil, err
	}
	return &outboxRun{dest: dest, relay: relay, held: held, counter: counter, stop: func() {}}, nil
}

// start runs the relay until stop.
func (o *outboxRun) start(ctx context.Context) {
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = o.relay.Run(rctx) })
	o.stop = func() { cancel(); wg.Wait() }
}

// startOutbox is newOutbox, started.
func startOutbox(ctx context.Context, ch channel, rdb runDB, target int) (*outboxRun, error) {
	o, err := newOutbox(ctx, ch, rdb, target)
	if err != nil {
		return nil, err
	}
	o.start(ctx)
	return o, nil
}

// waitHeld waits until the destination holds at least n messages, or
// timeout, and returns how many it holds.
func (o *outboxRun) waitHeld(ctx context.Context, n int, timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	for {
		got, err := o.held(ctx)
		if err == nil && got >= n || time.Now().After(deadline) || ctx.Err() != nil {
			return got, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// relayN is the number of messages the relay contender sends per run:
// four times the per-message runs' count, at least 20,000 outside quick
// mode, so that a run lasts long enough to time at tens of thousands of
// messages per second.
func (h *harness) relayN() int {
	if h.o.quick {
		return h.o.n
	}
	return max(4*h.o.n, 20000)
}

// relayThroughput is the relay contender's run: the outbox is filled with
// relayN pending messages (processed in batches of 100, each emitting one
// message, with no relay running), then a relay with idem.RelayConfig's
// defaults sends them to the broker. Throughput is messages sent per
// second, from the relay's start to the round that sent the last one;
// the destination must then hold them all.
func (h *harness) relayThroughput(ctx context.Context, b broker, db database, c contender) (result, error) {
	var r result
	n := h.relayN()
	tag := h.tag()
	ch, rdb, cleanup, err := openRun(ctx, b, db, tag)
	if err != nil {
		return r, err
	}
	defer cleanup()
	o, err := newOutbox(ctx, ch, rdb, n)
	if err != nil {
		return r, err
	}
	w := h.workload(tag, n, 0)
	if err := rdb.fillOutbox(ctx, "bench-"+c.name, o.dest, w.ids); err != nil {
		return r, fmt.Errorf("fill outbox: %w", err)
	}
	start := time.Now()
	o.start(ctx)
	timeout := time.Duration(n)*time.Millisecond + 60*time.Second
	select {
	case <-o.counter.done:
	case <-time.After(timeout):
		err = fmt.Errorf("the relay sent %d of %d messages in %v", o.counter.sent.Load(), n, timeout)
	case <-ctx.Done():
		err = ctx.Err()
	}
	o.stop()
	if err != nil {
		return r, err
	}
	r.Messages, r.Deliveries = n, n
	r.Elapsed = o.counter.at.Sub(start)
	r.Throughput = float64(n) / r.Elapsed.Seconds()
	if r.Relayed, err = o.waitHeld(ctx, n, 30*time.Second); err == nil && r.Relayed < n {
		err = fmt.Errorf("the relay reported %d messages sent, the broker holds %d", n, r.Relayed)
	}
	return r, err
}

package brokertest_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/brokertest"
)

// memBroker is a small in-memory at-least-once queue with the semantics of
// the real brokers the suite targets: ack timeouts, delayed redelivery,
// a dead letter, members that share the work. It tests the suite itself;
// the adapters run the suite against real brokers.
type memBroker struct {
	mu   sync.Mutex
	msgs []*memMsg
	dead []brokertest.DeadLetter
}

type memMsg struct {
	id      string
	payload []byte
	acked   bool
	// visibleAt is when the message may be delivered (again): after a nak
	// delay, or when the ack timeout of its delivery runs out.
	visibleAt time.Time
}

const memRetryDelay = 100 * time.Millisecond

var _ brokertest.BatchBroker = (*memBroker)(nil)

func (b *memBroker) Publish(_ context.Context, id string, payload []byte) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.msgs = append(b.msgs, &memMsg{id: id, payload: append([]byte(nil), payload...)})
	return nil
}

func (b *memBroker) DeadLetters(context.Context) ([]brokertest.DeadLetter, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]brokertest.DeadLetter(nil), b.dead...), nil
}

// take returns up to n deliverable messages, hiding them for redelivery.
func (b *memBroker) take(n int, redelivery time.Duration) []*memMsg {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	var out []*memMsg
	for _, m := range b.msgs {
		if len(out) == n {
			break
		}
		if !m.acked && !m.visibleAt.After(now) {
			m.visibleAt = now.Add(redelivery)
			out = append(out, m)
		}
	}
	return out
}

// settle carries out what idem decides for the outcome of m, as every
// adapter does: idem.Outcome.Settle.
func (b *memBroker) settle(m *memMsg, out idem.Outcome) {
	b.mu.Lock()
	defer b.mu.Unlock()
	st := out.Settle(memRetryDelay)
	switch st.Action {
	case idem.Ack:
		m.acked = true
	case idem.DeadLetter:
		h := st.DeadLetterHeaders()
		b.dead = append(b.dead, brokertest.DeadLetter{ID: m.id, Payload: m.payload,
			Reason: h[idem.HeaderDeadLetterReason], Error: h[idem.HeaderDeadLetterError]})
		m.acked = true
	default:
		m.visibleAt = time.Now().Add(st.Delay)
	}
}

// memConsumer is the memBroker's Consumer, with the lifecycle every
// adapter's Consumer has (brokertest.Runner).
type memConsumer struct {
	b       *memBroker
	opts    brokertest.StartOptions
	batch   int
	handle  func(ctx context.Context, ms []*memMsg, crashed *atomic.Bool)
	crashed atomic.Bool

	mu      sync.Mutex
	started bool
	stop    chan struct{} // closed by Stop
	stopped bool
	done    chan struct{} // closed when Run returns
}

func (b *memBroker) newConsumer(opts brokertest.StartOptions, batch int, handle func(context.Context, []*memMsg, *atomic.Bool)) *memConsumer {
	return &memConsumer{b: b, opts: opts, batch: max(batch, 1), handle: handle, stop: make(chan struct{}), done: make(chan struct{})}
}

func (c *memConsumer) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.started {
		c.mu.Unlock()
		return fmt.Errorf("membroker: %w", idem.ErrAlreadyRunning)
	}
	c.started = true
	c.mu.Unlock()
	defer close(c.done)
	var wg sync.WaitGroup
	for range max(c.opts.Concurrency, 1) {
		wg.Go(func() {
			for {
				select {
				case <-c.stop:
					return
				case <-ctx.Done():
					return
				default:
				}
				ms := c.b.take(c.batch, c.opts.Redelivery)
				if len(ms) == 0 {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				hctx, cancel := ctx, context.CancelFunc(func() {})
				if c.opts.HandlerTimeout > 0 {
					hctx, cancel = context.WithTimeout(ctx, c.opts.HandlerTimeout)
				}
				c.handle(hctx, ms, &c.crashed)
				cancel()
			}
		})
	}
	wg.Wait()
	select {
	case <-c.stop:
		return nil
	default:
		return ctx.Err()
	}
}

func (c *memConsumer) Stop(ctx context.Context) error {
	c.mu.Lock()
	if !c.stopped {
		c.stopped = true
		close(c.stop)
	}
	started := c.started
	c.mu.Unlock()
	if !started {
		return nil
	}
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// memMember is a memConsumer running.
type memMember struct{ c *memConsumer }

func (m memMember) Stop(ctx context.Context) error { return m.c.Stop(ctx) }

// Crash returns at once, as a killed process would not wait for its
// handlers; nothing of this member is settled any more.
func (m memMember) Crash() {
	m.c.crashed.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = m.c.Stop(ctx) // asks to stop; does not wait
}

func (b *memBroker) one(p idem.Processor) func(context.Context, []*memMsg, *atomic.Bool) {
	return func(ctx context.Context, ms []*memMsg, crashed *atomic.Bool) {
		m := ms[0]
		out := idem.Guard(ctx, p, idem.Message{ID: m.id, Payload: m.payload})
		if !crashed.Load() {
			b.settle(m, out)
		}
	}
}

func (b *memBroker) NewConsumer(p idem.Processor, opts brokertest.StartOptions) (brokertest.Runner, error) {
	return b.newConsumer(opts, 1, b.one(p)), nil
}

func (b *memBroker) Start(_ context.Context, p idem.Processor, opts brokertest.StartOptions) (brokertest.Member, error) {
	return b.run(b.newConsumer(opts, 1, b.one(p))), nil
}

func (b *memBroker) StartBatch(_ context.Context, p idem.BatchProcessor, opts brokertest.StartOptions) (brokertest.Member, error) {
	return b.run(b.newConsumer(opts, opts.BatchSize, func(ctx context.Context, ms []*memMsg, crashed *atomic.Bool) {
		in := make([]idem.Message, len(ms))
		for i, m := range ms {
			in[i] = idem.Message{ID: m.id, Payload: m.payload}
		}
		outs := idem.GuardBatch(ctx, p, in)
		if crashed.Load() {
			return
		}
		for i, m := range ms {
			b.settle(m, outs[i])
		}
	})), nil
}

func (b *memBroker) run(c *memConsumer) memMember {
	go func() { _ = c.Run(context.Background()) }()
	return memMember{c}
}

func TestRunMemoryBroker(t *testing.T) {
	brokertest.Run(t, brokertest.Harness{New: func(t *testing.T) brokertest.Broker { return &memBroker{} }})
}

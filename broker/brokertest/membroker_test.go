package brokertest_test

import (
	"context"
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

// settle applies one outcome to m.
func (b *memBroker) settle(m *memMsg, out idem.Outcome) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case out.Ack():
		m.acked = true
	case out.DeadLetter():
		reason := "no reason"
		if out.Err != nil {
			reason = out.Err.Error()
		}
		b.dead = append(b.dead, brokertest.DeadLetter{ID: m.id, Payload: m.payload, Reason: reason})
		m.acked = true
	case out.Status == idem.InProgress:
		m.visibleAt = time.Now().Add(out.RetryAfter)
	default:
		m.visibleAt = time.Now().Add(memRetryDelay)
	}
}

type memMember struct {
	stopping atomic.Bool
	crashed  atomic.Bool
	wg       sync.WaitGroup
}

func (m *memMember) Stop(ctx context.Context) error {
	m.stopping.Store(true)
	done := make(chan struct{})
	go func() { m.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (m *memMember) Crash() { m.crashed.Store(true); m.stopping.Store(true) }

func (b *memBroker) Start(_ context.Context, p idem.Processor, opts brokertest.StartOptions) (brokertest.Member, error) {
	return b.run(opts, 1, func(ctx context.Context, ms []*memMsg, mem *memMember) {
		m := ms[0]
		out, _ := p.Process(ctx, idem.Message{ID: m.id, Payload: m.payload})
		if !mem.crashed.Load() {
			b.settle(m, out)
		}
	}), nil
}

func (b *memBroker) StartBatch(_ context.Context, p idem.BatchProcessor, opts brokertest.StartOptions) (brokertest.Member, error) {
	return b.run(opts, opts.BatchSize, func(ctx context.Context, ms []*memMsg, mem *memMember) {
		in := make([]idem.Message, len(ms))
		for i, m := range ms {
			in[i] = idem.Message{ID: m.id, Payload: m.payload}
		}
		outs, _ := p.ProcessBatch(ctx, in)
		if mem.crashed.Load() {
			return
		}
		for i, m := range ms {
			var out idem.Outcome
			if i < len(outs) {
				out = outs[i]
			}
			b.settle(m, out)
		}
	}), nil
}

func (b *memBroker) run(opts brokertest.StartOptions, batch int, handle func(context.Context, []*memMsg, *memMember)) *memMember {
	mem := &memMember{}
	for range max(opts.Concurrency, 1) {
		mem.wg.Go(func() {
			for !mem.stopping.Load() {
				ms := b.take(max(batch, 1), opts.Redelivery)
				if len(ms) == 0 {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				handle(context.Background(), ms, mem)
			}
		})
	}
	return mem
}

func TestRunMemoryBroker(t *testing.T) {
	brokertest.Run(t, brokertest.Harness{New: func(t *testing.T) brokertest.Broker { return &memBroker{} }})
}

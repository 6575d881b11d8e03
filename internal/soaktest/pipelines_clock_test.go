package soaktest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
)

// memoryConsumer is the consumer name of the memory-clock pipeline.
const memoryConsumer = "soak-memory"

// memoryClock is the one pipeline a clock jump reaches: idem's memory
// store takes its clock (idem.NewMemoryStore(now)) and judges leases by
// it. The store lives in the test's process and dies with it, so this
// pipeline has no consumer process to kill: its broker delivers every
// message twice at once (as a broker redelivers), to workers in the
// test's process, in lease mode; the effect is the provider's charge, and
// every attempt tells the provider its token as it starts, so that a
// holder that completes after a later one took over (the clock jumped
// past its lease) is seen as a fenced completion.
type memoryClock struct {
	offset   atomic.Int64 // nanoseconds added to time.Now
	lc       *idem.LeaseConsumer
	provider *provider

	mu     sync.Mutex
	wg     sync.WaitGroup
	ctx    context.Context
	cancel context.CancelFunc
	done   map[string]bool // messages whose delivery reached Processed or Duplicate, both copies
	copies map[string]int  // copies of a message settled
}

// memoryLease is the memory-clock pipeline's lease: a jump of one to four
// leases moves every lease running past its end.
const memoryLease = 2 * time.Second

func startMemoryClock() (*memoryClock, error) {
	p := &memoryClock{provider: newProvider(), done: map[string]bool{}, copies: map[string]int{}}
	store := idem.NewMemoryStore(func() time.Time { return time.Now().Add(time.Duration(p.offset.Load())) })
	lc, err := idem.NewLeaseConsumer(store, idem.Config{Name: memoryConsumer, Lease: memoryLease,
		MaxAttempts: 1000, PurgeInterval: -1})
	if err != nil {
		return nil, err
	}
	p.lc = lc
	p.ctx, p.cancel = context.WithCancel(context.Background())
	return p, nil
}

func (p *memoryClock) name() string  { return "memory-clock" }
func (p *memoryClock) env() []string { return nil }

// local: no consumer process.
func (p *memoryClock) local() {}

// close ends the deliveries and waits for them.
func (p *memoryClock) close() {
	p.cancel()
	p.wg.Wait()
	p.lc.Close()
}

// publish delivers the message twice at once, each copy until it is
// settled (Processed or Duplicate).
func (p *memoryClock) publish(_ context.Context, id string, payload []byte) error {
	for range 2 {
		p.wg.Go(func() { p.deliver(id, payload) })
	}
	return nil
}

func (p *memoryClock) deliver(id string, payload []byte) {
	m := idem.Message{ID: id, Payload: payload}
	for p.ctx.Err() == nil {
		var token int64
		out, err := p.lc.Process(p.ctx, m, func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
			key := a.Key("charge")
			p.provider.seen(key, a.Token)
			body, err := a.Step(ctx, "charge", func(context.Context) ([]byte, error) {
				return p.provider.charge(key, a.Token), nil
			})
			if err != nil {
				return idem.Result{}, err
			}
			// Work after the call, during which the clock may jump.
			select {
			case <-time.After(time.Duration(rand.IntN(400)) * time.Millisecond):
			case <-ctx.Done():
				return idem.Result{}, ctx.Err()
			}
			token = a.Token
			return idem.Result{Body: body}, nil
		})
		if err == nil && out.Status == idem.Processed {
			p.provider.complete(id, token)
		}
		if err == nil && (out.Status == idem.Processed || out.Status == idem.Duplicate) {
			p.mu.Lock()
			p.copies[id]++
			p.done[id] = p.copies[id] == 2
			p.mu.Unlock()
			return
		}
		select {
		case <-p.ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (p *memoryClock) faults() []fault {
	return []fault{{kind: "jump memory-store clock", do: func(rng *rand.Rand) (string, error) {
		d := time.Duration(1+rng.IntN(4)) * memoryLease
		p.offset.Add(int64(d))
		return fmt.Sprintf("forward %v, to +%v", d, time.Duration(p.offset.Load())), nil
	}}}
}

func (p *memoryClock) drained(_ context.Context, ids []string) (bool, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	settled := 0
	for _, id := range ids {
		if p.done[id] {
			settled++
		}
	}
	return settled == len(ids), fmt.Sprintf("%d of %d delivered twice and settled", settled, len(ids))
}

func (p *memoryClock) check(_ context.Context, ids []string, r *result) {
	leaseVerdict(p.provider, memoryConsumer, ids, r)
	r.count("clock moved forward (s)", int(time.Duration(p.offset.Load())/time.Second))
}

package idemredisstream_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemredisstream"
	"github.com/idem-go/idem/internal/testenv"
)

// TestBreakStuckHandlerClaimedByOther: member c1's handler ignores its
// context past HandlerTimeout, so c1 stops keeping its entry alive and
// member c2 claims it (XAUTOCLAIM after MinIdle) while c1's handler still
// runs. Both run through one idem LeaseConsumer on a shared store, the
// effect inside Attempt.Step: c2's deliveries see the message in progress
// (c1's attempt holds its lease, renewed) until c1's handler returns;
// the effect is made once, the entry ends acknowledged, nothing is
// dead-lettered.
//
// Before Attempt.Step refused to start on an ended context, the effect
// was made twice: c1's Step, called after HandlerTimeout ended the
// handler's context, still called its function (Valid found the local
// deadline ahead and took the failed renewal for a store it could not
// reach), the function (deaf to its context too) made the effect, the
// recovery point's save failed on the ended context, and c2's attempt 2
// made the effect again.
func TestBreakStuckHandlerClaimedByOther(t *testing.T) {
	stream, dead := keys(t)
	lc, err := idem.NewLeaseConsumer(idem.NewMemoryStore(nil), idem.Config{Name: "stuck", Lease: time.Second, PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lc.Close() })
	var (
		effects  atomic.Int64
		calls    atomic.Int64
		member   sync.Map // the member of each handler call
		release  = make(chan struct{})
		relOnce  sync.Once
		c2Called = make(chan struct{})
		c2Once   sync.Once
	)
	proc := func(name string) idem.Processor {
		return idem.BindLease(lc, func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
			n := calls.Add(1)
			member.Store(n, name)
			if n == 1 {
				<-release // deaf to its context
			}
			_, err := a.Step(ctx, "effect", func(context.Context) ([]byte, error) {
				effects.Add(1)
				t.Logf("%s call %d attempt %d token %d: effect", name, n, a.Number, a.Token)
				return nil, nil
			})
			t.Logf("%s call %d attempt %d: step %v, ctx %v", name, n, a.Number, err, ctx.Err())
			if err != nil {
				return idem.Result{}, err
			}
			return idem.Result{Body: []byte("done")}, nil
		})
	}
	inProgress := func(name string) idem.Processor {
		p := proc(name)
		return idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
			out, err := p.Process(ctx, msg)
			t.Logf("%s: %v %v", name, out.Status, err)
			if out.Status == idem.InProgress {
				c2Once.Do(func() { close(c2Called) })
			}
			return out, err
		})
	}
	cfg := func(name string, p idem.Processor) idemredisstream.Config {
		return idemredisstream.Config{Processor: p, Stream: stream, Group: "g", Consumer: name, DeadLetter: dead,
			Concurrency: 2, HandlerTimeout: 300 * time.Millisecond, MinIdle: 600 * time.Millisecond, RetryDelay: 100 * time.Millisecond}
	}
	_, rdb, _ := start(t, cfg("c1", proc("c1")))
	t.Cleanup(func() { relOnce.Do(func() { close(release) }) })
	prod := idemredisstream.NewProducer(rdb, idemredisstream.ProducerConfig{})
	if _, err := prod.Publish(context.Background(), stream, []byte("x"), idemredisstream.WithMessageID("stuck-1")); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "c1's handler to start", func() bool { return calls.Load() >= 1 }, nil)
	start(t, cfg("c2", inProgress("c2")))
	select {
	case <-c2Called:
	case <-time.After(60 * time.Second):
		t.Fatal("no delivery saw the message in progress within 60s")
	}
	relOnce.Do(func() { close(release) })
	testenv.Eventually(t, 30*time.Second, "the entry acknowledged", func() bool {
		return pendingCount(t, rdb, stream, "g") == 0
	}, nil)
	if n := effects.Load(); n != 1 {
		t.Errorf("%d effects, want 1", n)
	}
	if n, err := rdb.XLen(context.Background(), dead).Result(); err != nil || n != 0 {
		t.Errorf("%d dead letters (%v), want 0", n, err)
	}
	t.Logf("handler calls %d", calls.Load())
}

package idemredisstream_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemredisstream"
	"github.com/idem-go/idem/internal/testenv"
)

// TestBreakStepAcrossHandlerTimeout: two members, 4 handlers each, take
// 12 entries through one idem LeaseConsumer (a shared store, a 2s lease),
// the effect inside Attempt.Step. For every other entry, the step's
// function (deaf to its context) starts before HandlerTimeout and
// returns after it, its effect made: Step saves the recovery point on a
// detached context, so whichever member's attempt comes next (the entry
// retried, or claimed by the other member once its keep-alive stopped)
// finds the step done. Every effect is made exactly once, every entry
// ends acknowledged, nothing is dead-lettered.
func TestBreakStepAcrossHandlerTimeout(t *testing.T) {
	stream, dead := keys(t)
	lc, err := idem.NewLeaseConsumer(idem.NewMemoryStore(nil), idem.Config{Name: "across", Lease: 2 * time.Second, PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lc.Close() })
	const n, handlerTimeout = 12, 300 * time.Millisecond
	var (
		mu      sync.Mutex
		effects = map[string]int{}
		calls   = map[string]int{}
	)
	proc := idem.BindLease(lc, func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
		mu.Lock()
		calls[a.Message.ID]++
		first := calls[a.Message.ID] == 1
		mu.Unlock()
		var i int
		_, _ = fmt.Sscanf(a.Message.ID, "s-%d", &i)
		_, err := a.Step(ctx, "effect", func(sctx context.Context) ([]byte, error) {
			if first && i%2 == 0 {
				<-sctx.Done()                  // HandlerTimeout
				time.Sleep(handlerTimeout / 3) // still working past it
			}
			mu.Lock()
			effects[a.Message.ID]++
			mu.Unlock()
			return []byte("ok"), nil
		})
		if err != nil {
			return idem.Result{}, err
		}
		return idem.Result{Body: []byte("done")}, nil
	})
	cfg := func(name string) idemredisstream.Config {
		return idemredisstream.Config{Processor: proc, Stream: stream, Group: "g", Consumer: name, DeadLetter: dead,
			Concurrency: 4, HandlerTimeout: handlerTimeout, MinIdle: 600 * time.Millisecond, RetryDelay: 50 * time.Millisecond}
	}
	_, rdb, _ := start(t, cfg("c1"))
	start(t, cfg("c2"))
	prod := idemredisstream.NewProducer(rdb, idemredisstream.ProducerConfig{})
	for i := range n {
		id := fmt.Sprintf("s-%02d", i)
		if _, err := prod.Publish(context.Background(), stream, []byte(id), idemredisstream.WithMessageID(id)); err != nil {
			t.Fatal(err)
		}
	}
	describe := func() string {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprintf("%d entries pending, effects %v", pendingCount(t, rdb, stream, "g"), effects)
	}
	testenv.Eventually(t, 60*time.Second, "every entry acknowledged", func() bool {
		mu.Lock()
		got := len(effects)
		mu.Unlock()
		return got == n && pendingCount(t, rdb, stream, "g") == 0
	}, describe)
	mu.Lock()
	defer mu.Unlock()
	for i := range n {
		id := fmt.Sprintf("s-%02d", i)
		if effects[id] != 1 {
			t.Errorf("%s: effect made %d times (%d handler calls), want once", id, effects[id], calls[id])
		}
	}
	if got, err := rdb.XLen(context.Background(), dead).Result(); err != nil || got != 0 {
		t.Errorf("%d dead letters (%v), want 0", got, err)
	}
}

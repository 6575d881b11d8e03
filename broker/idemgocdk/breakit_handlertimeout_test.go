package idemgocdk_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemgocdk"
	"gocloud.dev/pubsub"
	"gocloud.dev/pubsub/driver"
	"gocloud.dev/pubsub/mempubsub"
)

// TestBreakHandlerTimeoutRaces runs a transactional and a lease consumer
// (memory store) under a HandlerTimeout of 10s whose first delivery's
// handler ignores its context and succeeds 1ns before the deadline, at
// the deadline, 1ns after it, or long after it; later deliveries succeed
// at once. Each delivery is settled exactly once (never acked twice,
// never both acked and nacked), a nacked one is delivered again, and in
// the end the message is acked once and its effect (committed rows,
// external calls) happened once.
func TestBreakHandlerTimeoutRaces(t *testing.T) {
	t.Parallel()
	const timeout = 10 * time.Second
	for _, mode := range []string{"tx", "lease"} {
		for _, first := range []time.Duration{timeout - time.Nanosecond, timeout, timeout + time.Nanosecond, 3 * timeout} {
			t.Run(fmt.Sprintf("%s/first-takes-%v", mode, first), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					var calls, effects atomic.Int64
					wait := func() {
						if calls.Add(1) == 1 {
							time.Sleep(first) // the handler's own work, deaf to its context
						}
					}
					var p idem.Processor
					if mode == "tx" {
						c, err := idem.NewConsumer(idem.NewMemoryStore(nil), idem.Config{Name: "tx", PurgeInterval: -1})
						if err != nil {
							t.Fatal(err)
						}
						defer c.Close()
						p = idem.Bind(c, func(ctx context.Context, tx *idem.MemoryTx, m idem.Message) error {
							wait()
							tx.OnCommit(func() { effects.Add(1) })
							return nil
						})
					} else {
						c, err := idem.NewLeaseConsumer(idem.NewMemoryStore(nil), idem.Config{Name: "lease", Lease: time.Minute, PurgeInterval: -1})
						if err != nil {
							t.Fatal(err)
						}
						defer c.Close()
						p = idem.BindLease(c, func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
							effects.Add(1) // the external call, made before the wait
							wait()
							return idem.Result{Body: []byte("ok")}, nil
						})
					}
					d := &scriptDriver{canNack: true, msgs: make(chan *driver.Message, 1)}
					sub := pubsub.NewSubscription(d, nil, nil)
					dead := mempubsub.NewTopic()
					defer dead.Shutdown(context.Background())
					c, err := idemgocdk.NewConsumer(sub, idemgocdk.Config{DeadLetter: dead, Logger: quiet(),
						HandlerTimeout: timeout, RetryDelay: time.Second, Processor: p})
					if err != nil {
						t.Fatal(err)
					}
					done := run(t, c)
					deliveries := 0
					for ; deliveries < 5; deliveries++ {
						d.msgs <- &driver.Message{AckID: fmt.Sprintf("a%d", deliveries), LoggableID: "m1", Body: []byte("x"),
							Metadata: map[string]string{idemgocdk.DefaultIDKey: "order-1"}, AsFunc: func(any) bool { return false }}
						time.Sleep(time.Minute) // past the handler, the timeout and the delayed nack (fake time)
						synctest.Wait()
						if acks, _ := d.settled(); len(acks) > 0 {
							break
						}
					}
					if err := c.Stop(context.Background()); err != nil || <-done != nil {
						t.Fatalf("Stop: %v", err)
					}
					if err := sub.Shutdown(context.Background()); err != nil {
						t.Fatal(err)
					}
					acks, nacks := d.settled()
					seen := map[driver.AckID]int{}
					for _, id := range append(append([]driver.AckID(nil), acks...), nacks...) {
						seen[id]++
					}
					for id, n := range seen {
						if n != 1 {
							t.Errorf("delivery %v settled %d times (acks %v, nacks %v); want once", id, n, acks, nacks)
						}
					}
					if len(acks) != 1 || len(seen) != deliveries+1 {
						t.Errorf("acks %v, nacks %v over %d deliveries; want one ack, and every delivery settled", acks, nacks, deliveries+1)
					}
					if n := effects.Load(); n != 1 {
						t.Errorf("effect happened %d times over %d deliveries (handler calls %d); want once", n, deliveries+1, calls.Load())
					}
					t.Logf("%d deliveries, %d handler calls, acks %v, nacks %v", deliveries+1, calls.Load(), acks, nacks)
				})
			})
		}
	}
}

package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// Delivery is what Deliver needs: a transactional consumer, the handler's
// side effect, and the fault to inject mid-run.
type Delivery[TTx any] struct {
	// Consumer processes every delivery.
	Consumer *idem.Consumer[TTx]
	// Messages is how many distinct messages are delivered, each until it
	// is acknowledged; Workers is how many goroutines deliver them at once.
	Messages, Workers int
	// Effect writes the message's side effect in tx.
	Effect func(ctx context.Context, tx TTx, id string) error
	// FaultAt is the handler call that runs Fault, just before it writes
	// its effect: that delivery's transaction holds its claim when the
	// fault comes.
	FaultAt int64
	// Fault injects the fault (such as Proxy.Stall).
	Fault func()
}

// DeliveryReport is what Deliver observed.
type DeliveryReport struct {
	// Deliveries counts every Process call; Acked the messages
	// acknowledged (Processed or Duplicate), each once.
	Deliveries, Acked int
	// ByStatus counts the deliveries by outcome, and TimedOut those whose
	// error matched idem.ErrStoreTimeout, LockTimedOut idem.ErrLockTimeout.
	ByStatus               map[idem.Status]int
	TimedOut, LockTimedOut int
	// Hit counts the messages that had a delivery not acknowledged at or
	// after the fault.
	Hit int
	// Recovery is how long after the fault the last of those messages was
	// acknowledged; FirstFreed is how long after it the first delivery
	// that ran into the fault returned.
	Recovery, FirstFreed time.Duration
}

// String summarises the report for a test log.
func (r DeliveryReport) String() string {
	return fmt.Sprintf("%d deliveries for %d messages acked (outcomes %v; %d store timeouts, %d lock timeouts); %d messages hit by the fault; first delivery freed %v after it, all recovered %v after it",
		r.Deliveries, r.Acked, r.ByStatus, r.TimedOut, r.LockTimedOut, r.Hit, r.FirstFreed.Round(time.Millisecond), r.Recovery.Round(time.Millisecond))
}

// Deliver plays a broker that delivers d.Messages messages (IDs m-0000,
// m-0001, ...) at least once to d.Workers concurrent consumers until each
// is acknowledged: a delivery whose outcome is not an ack comes back after
// Outcome.RetryAfter (100ms when that is zero), as a broker's redelivery
// would. A redelivery goes ahead of the messages not yet delivered, as a
// broker's redelivery comes when its delay ends rather than after the
// backlog: Recovery measures how long the consumers took to work again,
// not how long the rest of the backlog took to drain (under a loaded
// machine that grew the measure by seconds). It injects d.Fault at
// handler call d.FaultAt and reports how the consumers recovered. It
// fails the test if a message is dead-lettered or ctx ends first.
func Deliver[TTx any](ctx context.Context, tb testing.TB, d Delivery[TTx]) DeliveryReport {
	tb.Helper()
	queue := make(chan string, d.Messages)
	for i := range d.Messages {
		queue <- fmt.Sprintf("m-%04d", i)
	}
	// redeliver holds the messages whose redelivery delay ended; a
	// worker takes them before queue's.
	redeliver := make(chan string, d.Messages)
	var (
		calls   atomic.Int64
		faultAt atomic.Int64 // unix nanoseconds; 0 before the fault
		mu      sync.Mutex
		rep     = DeliveryReport{ByStatus: map[idem.Status]int{}}
		hit     = map[string]bool{}
		acked   = map[string]bool{}
		done    = make(chan struct{})
		retries sync.WaitGroup
	)
	handler := func(ctx context.Context, tx TTx, m idem.Message) error {
		if calls.Add(1) == d.FaultAt {
			faultAt.Store(time.Now().UnixNano())
			d.Fault()
		}
		return d.Effect(ctx, tx, m.ID)
	}
	since := func() time.Duration {
		if at := faultAt.Load(); at != 0 {
			return time.Since(time.Unix(0, at))
		}
		return -1
	}
	var workers sync.WaitGroup
	for range d.Workers {
		workers.Go(func() {
			for {
				var id string
				select {
				case id = <-redeliver:
				default:
					select {
					case <-done:
						return
					case <-ctx.Done():
						return
					case id = <-redeliver:
					case id = <-queue:
					}
				}
				out, err := d.Consumer.Process(ctx, idem.Message{ID: id, Payload: []byte("payload of " + id)}, handler)
				after := since()
				if after >= 0 && !out.Ack() {
					tb.Logf("%v after the fault: message %s: %v: %v", after.Round(time.Millisecond), id, out.Status, err)
				}
				mu.Lock()
				rep.Deliveries++
				rep.ByStatus[out.Status]++
				if errors.Is(err, idem.ErrStoreTimeout) {
					rep.TimedOut++
				}
				if errors.Is(err, idem.ErrLockTimeout) {
					rep.LockTimedOut++
				}
				switch {
				case out.Ack():
					if after >= 0 && hit[id] {
						rep.Recovery = max(rep.Recovery, after)
					}
					if !acked[id] {
						acked[id] = true
						rep.Acked++
						if rep.Acked == d.Messages {
							close(done)
						}
					}
				case out.DeadLetter():
					tb.Errorf("message %s dead-lettered: %v", id, err)
				default:
					if after >= 0 && !hit[id] {
						if len(hit) == 0 {
							rep.FirstFreed = after
						}
						hit[id] = true
						rep.Hit = len(hit)
					}
					delay := out.RetryAfter
					if delay <= 0 {
						delay = 100 * time.Millisecond
					}
					retries.Add(1)
					time.AfterFunc(delay, func() { defer retries.Done(); redeliver <- id })
				}
				mu.Unlock()
			}
		})
	}
	workers.Wait()
	retries.Wait()
	if ctx.Err() != nil {
		mu.Lock()
		defer mu.Unlock()
		tb.Fatalf("deliveries did not finish: %v; %v", ctx.Err(), rep)
	}
	if faultAt.Load() == 0 {
		tb.Fatalf("the fault was never injected (handler calls: %d, FaultAt %d)", calls.Load(), d.FaultAt)
	}
	return rep
}

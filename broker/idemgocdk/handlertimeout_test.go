package idemgocdk_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemgocdk"
	"gocloud.dev/pubsub"
	"gocloud.dev/pubsub/driver"
	"gocloud.dev/pubsub/mempubsub"
)

// TestHandlerTimeout: a handler blocked on something that only its
// context ends (a database call on a stalled connection) gives up after
// HandlerTimeout (DefaultHandlerTimeout when unset), and its message is
// nacked for redelivery rather than held; a negative HandlerTimeout
// leaves it running.
func TestHandlerTimeout(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		timeout, want time.Duration // want 0: never cancelled
	}{
		{timeout: 10 * time.Second, want: 10 * time.Second},
		{timeout: 0, want: idemgocdk.DefaultHandlerTimeout},
		{timeout: -1, want: 0},
	} {
		t.Run(fmt.Sprint(tt.timeout), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := &scriptDriver{canNack: true, msgs: make(chan *driver.Message, 1)}
				sub := pubsub.NewSubscription(d, nil, nil)
				dead := mempubsub.NewTopic()
				defer dead.Shutdown(context.Background())
				release := make(chan struct{})
				gaveUp := make(chan time.Duration, 1)
				c, err := idemgocdk.NewConsumer(sub, idemgocdk.Config{DeadLetter: dead, Logger: quiet(),
					HandlerTimeout: tt.timeout, RetryDelay: time.Second,
					Processor: idem.ProcessorFunc(func(ctx context.Context, m idem.Message) (idem.Outcome, error) {
						start := time.Now()
						select {
						case <-ctx.Done():
							if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
								t.Errorf("handler's context ended with %v, want a deadline", ctx.Err())
							}
							gaveUp <- time.Since(start)
							return idem.Outcome{Status: idem.Failed, Err: ctx.Err()}, ctx.Err()
						case <-release:
							return idem.Outcome{Status: idem.Failed, Err: errBoom}, errBoom
						}
					})})
				if err != nil {
					t.Fatal(err)
				}
				done := run(t, c)
				d.msgs <- &driver.Message{AckID: "a1", LoggableID: "m1", Body: []byte("x"),
					Metadata: map[string]string{idemgocdk.DefaultIDKey: "order-1"}, AsFunc: func(any) bool { return false }}
				time.Sleep(10 * time.Minute) // fake time, in the bubble
				synctest.Wait()
				select {
				case took := <-gaveUp:
					if tt.want == 0 || took != tt.want {
						t.Errorf("the handler gave up after %v; want %v (0: never)", took, tt.want)
					}
				default:
					if tt.want != 0 {
						t.Errorf("the handler still runs after 10 minutes; want it cancelled after %v", tt.want)
					}
					close(release)
				}
				time.Sleep(2 * time.Second) // RetryDelay
				synctest.Wait()
				if err := c.Stop(context.Background()); err != nil || <-done != nil {
					t.Fatalf("Stop: %v", err)
				}
				if err := sub.Shutdown(context.Background()); err != nil {
					t.Fatal(err)
				}
				if acks, nacks := d.settled(); len(acks) != 0 || len(nacks) != 1 {
					t.Errorf("acks %v, nacks %v; want the message nacked once, never acked", acks, nacks)
				}
			})
		})
	}
}

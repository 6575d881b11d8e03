package idemredisstream_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemredisstream"
	"github.com/idem-go/idem/internal/testenv"
)

// TestHandlerTimeout: a first delivery whose handler is stuck gives up,
// or is given up, after HandlerTimeout, and the entry is delivered again
// and processed, instead of being held for ever (a running member keeps
// its entries alive):
//   - a handler blocked on something only its context ends (a database
//     call on a stalled connection) sees its context end, fails, and the
//     entry is retried after RetryDelay;
//   - a handler that ignores its context is no longer kept alive after
//     HandlerTimeout, so XAUTOCLAIM hands its entry out again after
//     MinIdle, while it still runs (to this member's other worker here).
//
// Nothing is dead-lettered, and the entry ends acknowledged.
func TestHandlerTimeout(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		ignoresCtx bool
	}{
		{"handler gives up", false},
		{"handler ignores its context", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			stream, dead := keys(t)
			release := make(chan struct{})
			var releaseOnce sync.Once
			var (
				mu       sync.Mutex
				attempts int
				firstErr error
				second   = make(chan struct{})
				// firstDone is closed once the first attempt has
				// recorded firstErr: the second attempt can be
				// acknowledged before the first one's context ends.
				firstDone = make(chan struct{})
			)
			p := idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
				mu.Lock()
				attempts++
				n := attempts
				mu.Unlock()
				if n > 1 {
					if n == 2 {
						close(second)
					}
					return idem.Outcome{Status: idem.Processed, MessageID: msg.ID}, nil
				}
				if tc.ignoresCtx {
					<-release // stuck until the second attempt came
					// Then its context's end, which the deadline makes
					// (its timer, due when the keep-alive ended, may fire
					// later than the second attempt on a loaded machine).
					select {
					case <-ctx.Done():
					case <-time.After(30 * time.Second):
					}
				} else {
					<-ctx.Done() // stalled until the handler's context ends
				}
				mu.Lock()
				firstErr = ctx.Err()
				mu.Unlock()
				close(firstDone)
				err := errors.New("stuck")
				return idem.Outcome{Status: idem.Failed, MessageID: msg.ID, Err: err}, err
			})
			// Two workers: the stuck handler holds one, and the member
			// claims and reads only for free ones.
			_, rdb, _ := start(t, idemredisstream.Config{Processor: p, Stream: stream, Group: "g", Consumer: "c1", DeadLetter: dead,
				Concurrency: 2, HandlerTimeout: 300 * time.Millisecond, MinIdle: 600 * time.Millisecond, RetryDelay: 100 * time.Millisecond})
			// Registered after start's: runs first, so that Run can return.
			t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
			prod := idemredisstream.NewProducer(rdb, idemredisstream.ProducerConfig{})
			if _, err := prod.Publish(context.Background(), stream, []byte("x"), idemredisstream.WithMessageID("stuck-1")); err != nil {
				t.Fatal(err)
			}
			select {
			case <-second:
			case <-time.After(60 * time.Second):
				t.Fatal("the entry was not delivered again within 60s")
			}
			releaseOnce.Do(func() { close(release) })
			testenv.Eventually(t, 30*time.Second, "the entry acknowledged", func() bool {
				return pendingCount(t, rdb, stream, "g") == 0
			}, nil)
			select {
			case <-firstDone:
			case <-time.After(60 * time.Second):
				t.Fatal("the first attempt did not return within 60s")
			}
			mu.Lock()
			defer mu.Unlock()
			if !errors.Is(firstErr, context.DeadlineExceeded) {
				t.Errorf("the first attempt's context ended with %v, want its deadline", firstErr)
			}
			if n, err := rdb.XLen(context.Background(), dead).Result(); err != nil || n != 0 {
				t.Errorf("%d dead letters (%v), want 0", n, err)
			}
		})
	}
}

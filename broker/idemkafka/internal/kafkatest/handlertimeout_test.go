package kafkatest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemkafka"
	"github.com/idem-go/idem/internal/testenv"
)

// TestHandlerTimeout: a handler blocked on something only its context ends
// (a database call on a stalled connection) gives up when HandlerTimeout
// ends that context; its record is not committed (the group's lag stays at
// one while the retry runs) and is processed again in place by the next
// attempt, instead of holding its partition for ever. Nothing is
// dead-lettered.
func TestHandlerTimeout(t *testing.T) {
	t.Parallel()
	topic, dead, group := uniqueName("stuck"), uniqueName("stuck-dead"), uniqueName("stuck-group")
	seeds := newCluster(t, topic, dead).ListenAddrs()
	p := idemkafka.NewProducer(newClient(t, seeds), idemkafka.ProducerConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if _, err := p.Publish(ctx, topic, []byte("x"), idemkafka.WithMessageID("stuck-1")); err != nil {
		t.Fatal(err)
	}

	const timeout = 300 * time.Millisecond
	var (
		mu         sync.Mutex
		attempts   int
		firstErr   error
		firstLimit time.Duration      // the first attempt's deadline, from its start
		lagRetry   int64         = -1 // the group's lag when the second attempt began
	)
	proc := idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
		mu.Lock()
		attempts++
		n := attempts
		mu.Unlock()
		if n == 1 {
			dl, ok := ctx.Deadline()
			limit := time.Until(dl)
			<-ctx.Done() // stalled until the handler's context ends
			mu.Lock()
			firstErr = ctx.Err()
			if ok {
				firstLimit = limit
			}
			mu.Unlock()
			return idem.Outcome{Status: idem.Failed, MessageID: msg.ID, Err: ctx.Err()}, ctx.Err()
		}
		lag := groupLag(t, seeds, group, topic)
		mu.Lock()
		if n == 2 {
			lagRetry = lag
		}
		mu.Unlock()
		return idem.Outcome{Status: idem.Processed, MessageID: msg.ID}, nil
	})
	m := startMember(t, seeds, group, topic, idemkafka.Config{Processor: proc, DeadLetter: dead,
		HandlerTimeout: timeout, RetryDelay: 100 * time.Millisecond})
	testenv.Eventually(t, waitFor, "the record processed and committed after its first attempt timed out", func() bool {
		mu.Lock()
		n := attempts
		mu.Unlock()
		return n >= 2 && groupLag(t, seeds, group, topic) == 0
	}, func() string {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprintf("%d attempts", attempts)
	})
	if err := m.stop(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if attempts != 2 || !errors.Is(firstErr, context.DeadlineExceeded) {
		t.Errorf("%d attempts, the first ended with %v; want 2, the first by its deadline", attempts, firstErr)
	}
	if firstLimit <= 0 || firstLimit > timeout {
		t.Errorf("the first attempt's context ended %v after it started; want a deadline within HandlerTimeout (%v)", firstLimit, timeout)
	}
	if lagRetry != 1 {
		t.Errorf("group lag %d when the timed-out record was retried; want 1 (its offset not committed)", lagRetry)
	}
	dls, err := deadLetters(ctx, seeds, dead)
	if err != nil || len(dls) != 0 {
		t.Errorf("%d dead letters (%v), want 0", len(dls), err)
	}
}

// TestHandlerTimeoutDefault: an unset HandlerTimeout gives the handler a
// context ending DefaultHandlerTimeout after the call started; a negative
// one, a context without a deadline.
func TestHandlerTimeoutDefault(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		timeout time.Duration
		want    time.Duration // 0: no deadline
	}{
		{timeout: 0, want: idemkafka.DefaultHandlerTimeout},
		{timeout: -1, want: 0},
	} {
		t.Run(fmt.Sprint(tt.timeout), func(t *testing.T) {
			t.Parallel()
			topic, dead, group := uniqueName("bound"), uniqueName("bound-dead"), uniqueName("bound-group")
			seeds := newCluster(t, topic, dead).ListenAddrs()
			p := idemkafka.NewProducer(newClient(t, seeds), idemkafka.ProducerConfig{})
			ctx, cancel := context.WithTimeout(context.Background(), waitFor)
			defer cancel()
			if _, err := p.Publish(ctx, topic, []byte("x"), idemkafka.WithMessageID("bound-1")); err != nil {
				t.Fatal(err)
			}
			limits := make(chan time.Duration, 1) // the handler's deadline from its start; -1: none
			proc := idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
				limit := time.Duration(-1)
				if dl, ok := ctx.Deadline(); ok {
					limit = time.Until(dl)
				}
				select {
				case limits <- limit:
				default:
				}
				return idem.Outcome{Status: idem.Processed, MessageID: msg.ID}, nil
			})
			m := startMember(t, seeds, group, topic, idemkafka.Config{Processor: proc, DeadLetter: dead, HandlerTimeout: tt.timeout})
			var got time.Duration
			select {
			case got = <-limits:
			case <-ctx.Done():
				t.Fatal("the record was not processed")
			}
			if err := m.stop(ctx); err != nil {
				t.Fatal(err)
			}
			switch {
			case tt.want == 0 && got != -1:
				t.Errorf("the handler's context ends %v after its start; want no deadline", got)
			case tt.want > 0 && (got <= tt.want-time.Minute || got > tt.want):
				t.Errorf("the handler's context ends %v after its start; want about %v", got, tt.want)
			}
		})
	}
}

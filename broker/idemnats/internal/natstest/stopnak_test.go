package natstest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemnats"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/nats-io/nats.go/jetstream"
)

// The messages a member holds but has not started when it stops are
// Nak'ed and go to another member at once, not after the ack wait (ten
// minutes here): none of them is left with the stopped member's pull
// request.
func TestStopNakedGoToNextMember(t *testing.T) {
	t.Parallel()
	for _, later := range []bool{false, true} {
		t.Run(fmt.Sprintf("second-started-after-stop-%v", later), func(t *testing.T) {
			t.Parallel()
			testStopNaked(t, later)
		})
	}
}

// testStopNaked runs the case, the second member started before the
// first stops, or after it stopped (later).
func testStopNaked(t *testing.T, later bool) {
	js, s, cons := inProcessConsumer(t, jetstream.ConsumerConfig{Durable: "naked", AckWait: 10 * time.Minute})
	ctx := context.Background()
	var mu sync.Mutex
	done := map[string]string{} // message ID -> member that processed it
	release := make(chan struct{})
	started := make(chan struct{})
	proc := func(name string, block bool) idem.Processor {
		return idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
			if block {
				block = false
				close(started)
				<-release
			}
			mu.Lock()
			done[msg.ID] = name
			mu.Unlock()
			return idem.Outcome{Status: idem.Processed, MessageID: msg.ID}, nil
		})
	}
	first, err := idemnats.NewConsumer(js, cons, idemnats.Config{Processor: proc("first", true), Concurrency: 1, MaxMessages: 8, DeadLetter: s.dlSubject, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	firstDone := make(chan error, 1)
	go func() { firstDone <- first.Run(ctx) }()
	const n = 5
	for i := range n {
		if _, err := idemnats.NewProducer(js).Publish(ctx, s.subject, []byte("p"), idemnats.WithMessageID(fmt.Sprintf("m-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	<-started
	testenv.Eventually(t, 10*time.Second, "every message held by the first member", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == n
	}, nil)
	second, err := idemnats.NewConsumer(js, cons, idemnats.Config{Processor: proc("second", false), Concurrency: 4, DeadLetter: s.dlSubject, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if !later {
		runConsumer(t, second)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- first.Stop(ctx) }()
	close(release)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	<-firstDone
	if later {
		runConsumer(t, second)
	}
	start := time.Now()
	testenv.Eventually(t, 3*time.Minute, "every message processed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(done) == n
	}, nil)
	took := time.Since(start)
	mu.Lock()
	t.Logf("processed %v, the last %v after the first member stopped", done, took)
	mu.Unlock()
	if took > 2*time.Minute {
		t.Errorf("the messages the stopped member held were processed %v after it stopped: they waited for the ack wait (10m)", took)
	}
}

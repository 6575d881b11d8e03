package natstest

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemnats"
	"github.com/idem-go/idem/internal/faultproxy"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestBreakNATSStalledConnection: the consumer's connection to the NATS
// server is black-holed (a fault proxy stalls it: nothing moves, nothing
// is closed) while messages keep coming, published on a connection of
// their own. The pull request out is lost (its 1s heartbeats stop), the
// next ones go into the dead connection too, until nats.go's pings find
// it stale and it reconnects (here PingInterval 1s, 2 outstanding:
// consuming resumed 5.0s after the stall in 3 runs of 3;
// IDEM_BREAKIT_NATS_DEFAULT_PING=1 keeps nats.go's 2 minutes, and
// consuming then resumed 6m01s after it, one run: the heartbeats end each
// lost request, but the next ones go into the same dead connection until
// its pings time out). Then every message is processed: each
// effect made once (idem on the memory store; a message whose ack was
// lost in the stall is redelivered and found a duplicate).
func TestBreakNATSStalledConnection(t *testing.T) {
	url := testenv.URL(t, testenv.NATSEnv, "nats://127.0.0.1:4222 (a JetStream-enabled server)")
	proxy, purl := faultproxy.URL(t, url)
	opts := []nats.Option{nats.PingInterval(time.Second), nats.MaxPingsOutstanding(2)}
	if os.Getenv("IDEM_BREAKIT_NATS_DEFAULT_PING") == "1" {
		opts = nil
	}
	_, js := newJS(t, reconnecting(purl, 100*time.Millisecond, opts...))
	_, pub := newJS(t, external(t))
	s := newStreams(t, pub, time.Minute)
	if _, err := s.stream.CreateOrUpdateConsumer(context.Background(), jetstream.ConsumerConfig{
		Durable: "stall", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second,
	}); err != nil {
		t.Fatal(err)
	}
	// The consumer's handle on the proxied connection: its pull requests,
	// messages and acks go through the proxy.
	cons, err := js.Consumer(context.Background(), s.name, "stall")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		effects = map[string]int{}
		calls   int
	)
	ic, err := idem.NewConsumer[*idem.MemoryTx](idem.NewMemoryStore(nil), idem.Config{Name: "stall", PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ic.Close() }()
	proc := idem.Bind(ic, func(_ context.Context, tx *idem.MemoryTx, m idem.Message) error {
		mu.Lock()
		calls++
		mu.Unlock()
		tx.OnCommit(func() {
			mu.Lock()
			defer mu.Unlock()
			effects[string(m.Payload)]++
		})
		return nil
	})
	c, err := idemnats.NewConsumer(js, cons, idemnats.Config{Processor: proc, DeadLetter: s.dlSubject, Concurrency: 4, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	runDone := make(chan error, 1)
	go func() { runDone <- c.Run(context.Background()) }()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
		if err := <-runDone; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	publish := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			m := nats.NewMsg(s.subject)
			m.Data = []byte(fmt.Sprintf("m-%03d", i))
			m.Header.Set(jetstream.MsgIDHeader, string(m.Data))
			if _, err := pub.PublishMsg(context.Background(), m); err != nil {
				t.Fatal(err)
			}
		}
	}
	done := func(n int) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(effects) >= n
		}
	}
	describe := func() string {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprintf("%d messages processed, %d calls", len(effects), calls)
	}
	const before, during = 20, 20
	publish(0, before)
	testenv.Eventually(t, 30*time.Second, "the messages before the stall", done(before), describe)
	stalled := time.Now()
	if n := proxy.Stall(); n == 0 {
		t.Fatal("no connection to stall")
	}
	publish(before, before+during)
	testenv.Eventually(t, 10*time.Minute, "the messages published during the stall", done(before+during), describe)
	t.Logf("consuming resumed %v after the stall; %s", time.Since(stalled), describe())
	mu.Lock()
	defer mu.Unlock()
	for i := range before + during {
		if n := effects[fmt.Sprintf("m-%03d", i)]; n != 1 {
			t.Errorf("m-%03d: effect made %d times, want once", i, n)
		}
	}
}

package idemwatermill_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemwatermill"
)

// runFanOut publishes n messages to a gochannel Pub/Sub with subs
// handlers on the topic, each wrapped by mw: every subscriber receives
// every message at once, so each message arrives subs times concurrently.
// It returns when every copy was acknowledged (a nacked copy comes back
// to its subscriber), or fails the test after a minute.
func runFanOut(t *testing.T, mw message.HandlerMiddleware, n, subs int, effect func(*message.Message) error) {
	t.Helper()
	pubsub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: int64(n)}, watermill.NopLogger{})
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	acked := make(chan string, n*subs)
	for i := range subs {
		h := mw(func(msg *message.Message) ([]*message.Message, error) { return nil, effect(msg) })
		router.AddConsumerHandler(fmt.Sprintf("sub-%d", i), "payments", pubsub, func(msg *message.Message) error {
			_, err := h(msg)
			if err == nil {
				acked <- msg.UUID
			}
			return err
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); router.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; pubsub.Close() })
	<-router.Running()
	for i := range n {
		if err := pubsub.Publish("payments", message.NewMessage(fmt.Sprintf("pay-%d", i), nil)); err != nil {
			t.Fatal(err)
		}
	}
	timeout := time.After(time.Minute)
	for i := range n * subs {
		select {
		case <-acked:
		case <-timeout:
			t.Fatalf("%d of %d copies acknowledged after a minute", i, n*subs)
		}
	}
}

// checkOnce checks that each of n messages had its effect exactly once.
func checkOnce(t *testing.T, effects map[string]int, n int) {
	t.Helper()
	if len(effects) != n {
		t.Errorf("%d messages had an effect; want %d", len(effects), n)
	}
	for id, k := range effects {
		if k != 1 {
			t.Errorf("%s had its effect %d times", id, k)
		}
	}
}

// Every message arrives at 8 subscribers at once, each through the
// transactional middleware of one consumer: each is charged once and
// every copy is acknowledged.
func TestTransactionalFanOutDuplicates(t *testing.T) {
	c, _ := newConsumer(t)
	const n, subs = 200, 8
	var mu sync.Mutex
	charged := map[string]int{}
	mw, err := idemwatermill.Transactional(c, idemwatermill.Config{RetryDelay: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runFanOut(t, mw, n, subs, func(msg *message.Message) error {
		tx, ok := idemwatermill.Tx[*idem.MemoryTx](msg.Context())
		if !ok {
			return errors.New("no transaction")
		}
		id := msg.UUID
		tx.OnCommit(func() { mu.Lock(); charged[id]++; mu.Unlock() })
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	checkOnce(t, charged, n)
}

// The same in lease mode: each message's handler runs once.
func TestLeaseFanOutDuplicates(t *testing.T) {
	lc, err := idem.NewLeaseConsumer(idem.NewMemoryStore(nil), idem.Config{Name: "charges", Lease: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lc.Close() })
	const n, subs = 200, 8
	var mu sync.Mutex
	calls := map[string]int{}
	mw, err := idemwatermill.Lease(lc, idemwatermill.Config{RetryDelay: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runFanOut(t, mw, n, subs, func(msg *message.Message) error {
		mu.Lock()
		calls[msg.UUID]++
		mu.Unlock()
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	checkOnce(t, calls, n)
}

// A message whose context is cancelled before its claim is not
// acknowledged, and its redelivery is processed once.
func TestCancelledBeforeClaim(t *testing.T) {
	c, _ := newConsumer(t)
	var charged int
	mw, err := idemwatermill.Transactional(c, idemwatermill.Config{})
	h := wrap(t, mw, err, func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := idemwatermill.Tx[*idem.MemoryTx](msg.Context())
		tx.OnCommit(func() { charged++ })
		return nil, nil
	})
	msg := message.NewMessage("pay-1", nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	msg.SetContext(ctx)
	if _, err := h(msg); err == nil {
		t.Fatalf("a delivery whose context was cancelled was acknowledged (charged %d)", charged)
	}
	if _, err := h(message.NewMessage("pay-1", nil)); err != nil || charged != 1 {
		t.Fatalf("redelivery: %v, charged %d; want nil and 1", err, charged)
	}
}

// A lease-mode handler that panics is Failed (idem.ErrHandlerPanic) and
// nacked, not dead-lettered; its lease is released, so the redelivery
// runs the handler again at once and is acknowledged.
func TestLeaseHandlerPanic(t *testing.T) {
	lc, err := idem.NewLeaseConsumer(idem.NewMemoryStore(nil), idem.Config{Name: "charges", Lease: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lc.Close() })
	var calls int
	mw, err := idemwatermill.Lease(lc, idemwatermill.Config{RetryDelay: time.Nanosecond})
	h := wrap(t, mw, err, func(msg *message.Message) ([]*message.Message, error) {
		calls++
		if calls == 1 {
			panic("boom")
		}
		return nil, nil
	})
	_, err = h(message.NewMessage("pay-1", nil))
	if !errors.Is(err, idem.ErrHandlerPanic) || idemwatermill.ShouldDeadLetter(err) {
		t.Fatalf("got %v; want a redeliver error matching ErrHandlerPanic", err)
	}
	if _, err := h(message.NewMessage("pay-1", nil)); err != nil || calls != 2 {
		t.Fatalf("redelivery: %v after %d calls; want nil after 2 (the panicking attempt's lease released)", err, calls)
	}
}

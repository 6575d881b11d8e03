package idemwatermill_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemwatermill"
)

func newConsumer(t *testing.T) (*idem.Consumer[*idem.MemoryTx], *idem.MemoryStore) {
	t.Helper()
	store := idem.NewMemoryStore(nil)
	c, err := idem.NewConsumer(store, idem.Config{Name: "charges"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, store
}

func wrap(t *testing.T, mw message.HandlerMiddleware, err error, h message.HandlerFunc) message.HandlerFunc {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	return mw(h)
}

// The effect commits once; the duplicate is acked without the handler and
// without the handler's output, which only the processed delivery returns.
func TestTransactionalDuplicate(t *testing.T) {
	c, _ := newConsumer(t)
	var charged, calls atomic.Int32
	mw, err := idemwatermill.Transactional(c, idemwatermill.Config{})
	h := wrap(t, mw, err, func(msg *message.Message) ([]*message.Message, error) {
		calls.Add(1)
		tx, ok := idemwatermill.Tx[*idem.MemoryTx](msg.Context())
		if !ok {
			t.Error("no transaction in the handler's context")
			return nil, errors.New("no tx")
		}
		tx.OnCommit(func() { charged.Add(1) })
		return []*message.Message{message.NewMessage("receipt-"+msg.UUID, nil)}, nil
	})
	out, err := h(message.NewMessage("pay-1", []byte("100")))
	if err != nil || len(out) != 1 || out[0].UUID != "receipt-pay-1" {
		t.Fatalf("first delivery: %v, %v; want the receipt and nil", out, err)
	}
	out, err = h(message.NewMessage("pay-1", []byte("100")))
	if err != nil || len(out) != 0 {
		t.Fatalf("redelivery: %v, %v; want nothing and nil", out, err)
	}
	if calls.Load() != 1 || charged.Load() != 1 {
		t.Fatalf("handler ran %d times, charged %d; want 1 and 1", calls.Load(), charged.Load())
	}
	// The same ID with another payload is never a silent replay.
	_, err = h(message.NewMessage("pay-1", []byte("999")))
	if !errors.Is(err, idem.ErrFingerprintMismatch) || !idemwatermill.ShouldDeadLetter(err) {
		t.Fatalf("other payload: %v; want a dead-letter error matching ErrFingerprintMismatch", err)
	}
}

// A failing handler rolls back its effect with the claim; the redelivery
// runs it again and it commits once.
func TestTransactionalFailureRedelivered(t *testing.T) {
	c, _ := newConsumer(t)
	var charged, calls atomic.Int32
	boom := errors.New("provider down")
	mw, err := idemwatermill.Transactional(c, idemwatermill.Config{RetryDelay: time.Nanosecond})
	h := wrap(t, mw, err, func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := idemwatermill.Tx[*idem.MemoryTx](msg.Context())
		tx.OnCommit(func() { charged.Add(1) })
		if calls.Add(1) == 1 {
			return nil, boom
		}
		return nil, nil
	})
	_, err = h(message.NewMessage("pay-1", nil))
	var e *idemwatermill.Error
	if !errors.Is(err, boom) || !errors.As(err, &e) || e.Settlement.Action != idem.Redeliver || idemwatermill.ShouldDeadLetter(err) {
		t.Fatalf("failed delivery: %v; want a redeliver error wrapping the handler's", err)
	}
	if charged.Load() != 0 {
		t.Fatal("a failed handler's effect committed")
	}
	if _, err := h(message.NewMessage("pay-1", nil)); err != nil {
		t.Fatal(err)
	}
	if _, err := h(message.NewMessage("pay-1", nil)); err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 2 || charged.Load() != 1 {
		t.Fatalf("handler ran %d times, charged %d; want 2 and 1", calls.Load(), charged.Load())
	}
}

// No ID (an empty UUID, or a missing metadata key) is rejected with a typed
// error, for a poison queue, and the handler never runs.
func TestMissingMessageID(t *testing.T) {
	c, _ := newConsumer(t)
	for name, cfg := range map[string]idemwatermill.Config{"uuid": {}, "key": {IDKey: "Payment-Id"}} {
		t.Run(name, func(t *testing.T) {
			mw, err := idemwatermill.Transactional(c, cfg)
			h := wrap(t, mw, err, func(*message.Message) ([]*message.Message, error) {
				t.Error("the handler ran for a message without an ID")
				return nil, nil
			})
			uuid := ""
			if cfg.IDKey != "" {
				uuid = "has-a-uuid-but-no-key"
			}
			msg := message.NewMessage(uuid, []byte("x"))
			_, err = h(msg)
			if !errors.Is(err, idem.ErrMissingMessageID) || !idemwatermill.ShouldDeadLetter(err) {
				t.Fatalf("got %v; want a dead-letter error matching ErrMissingMessageID", err)
			}
			if got := msg.Metadata.Get(idem.HeaderDeadLetterReason); got != idem.ReasonMissingMessageID {
				t.Fatalf("dead-letter reason %q; want %q", got, idem.ReasonMissingMessageID)
			}
		})
	}
}

// Lease mode stores the handler's output and returns it to the duplicate,
// so the Router publishes it again after a crash before its publish.
func TestLeaseReplaysOutput(t *testing.T) {
	lc, err := idem.NewLeaseConsumer(idem.NewMemoryStore(nil), idem.Config{Name: "emails", Lease: time.Minute, PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lc.Close() })
	var calls atomic.Int32
	mw, err := idemwatermill.Lease(lc, idemwatermill.Config{})
	h := wrap(t, mw, err, func(msg *message.Message) ([]*message.Message, error) {
		calls.Add(1)
		a := idemwatermill.Attempt(msg.Context())
		if a == nil || a.Token <= 0 {
			t.Errorf("attempt %+v; want one with a fencing token", a)
		}
		out := message.NewMessage("sent-"+msg.UUID, []byte("ok"))
		out.Metadata.Set("To", "ada@example.com")
		return []*message.Message{out}, nil
	})
	first, err := h(message.NewMessage("mail-1", []byte("hi")))
	if err != nil {
		t.Fatal(err)
	}
	again, err := h(message.NewMessage("mail-1", []byte("hi")))
	if err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 1 {
		t.Fatalf("handler ran %d times; want 1", calls.Load())
	}
	if len(first) != 1 || len(again) != 1 || !first[0].Equals(again[0]) {
		t.Fatalf("duplicate returned %v; want the first output %v again", again, first)
	}
}

// Through a real Router: a message without its ID key goes to the poison
// topic with idem's reason and is acked there; the others are charged once.
func TestRouterPoisonQueue(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ps := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	defer ps.Close()
	poisoned, err := ps.Subscribe(ctx, "payments.poison")
	if err != nil {
		t.Fatal(err)
	}
	c, _ := newConsumer(t)
	idempotent, err := idemwatermill.Transactional(c, idemwatermill.Config{IDKey: "Payment-Id"})
	if err != nil {
		t.Fatal(err)
	}
	pq, err := middleware.PoisonQueueWithFilter(ps, "payments.poison", idemwatermill.ShouldDeadLetter)
	if err != nil {
		t.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	var charged atomic.Int32
	done := make(chan *message.Message, 4)
	handler := router.AddHandler("charge", "payments", ps, "receipts", ps, func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := idemwatermill.Tx[*idem.MemoryTx](msg.Context())
		tx.OnCommit(func() { charged.Add(1) })
		return nil, nil
	})
	handler.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			defer func() { done <- msg }()
			return h(msg)
		}
	}, pq, idempotent)
	go router.Run(ctx)
	<-router.Running()
	for _, key := range []string{"p-1", "p-1", "", "p-2"} {
		m := message.NewMessage(watermill.NewUUID(), []byte("amount 100"))
		if key != "" {
			m.Metadata.Set("Payment-Id", key)
		}
		if err := ps.Publish("payments", m); err != nil {
			t.Fatal(err)
		}
	}
	for range 4 {
		<-done
	}
	p := <-poisoned
	p.Ack()
	if got := p.Metadata.Get(idem.HeaderDeadLetterReason); got != idem.ReasonMissingMessageID {
		t.Fatalf("poisoned message reason %q; want %q", got, idem.ReasonMissingMessageID)
	}
	if err := router.Close(); err != nil {
		t.Fatal(err)
	}
	if charged.Load() != 2 {
		t.Fatalf("charged %d; want 2 (p-1 once, p-2 once)", charged.Load())
	}
}

func TestConfigErrors(t *testing.T) {
	if _, err := idemwatermill.Transactional[*idem.MemoryTx](nil, idemwatermill.Config{}); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("nil Consumer: %v", err)
	}
	if _, err := idemwatermill.Lease(nil, idemwatermill.Config{}); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("nil LeaseConsumer: %v", err)
	}
	c, _ := newConsumer(t)
	if _, err := idemwatermill.Transactional(c, idemwatermill.Config{RetryDelay: -1}); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("negative RetryDelay: %v", err)
	}
}

// A handler that panics is Failed (idem.ErrHandlerPanic), its effect rolled
// back, and its message nacked for redelivery, not dead-lettered.
func TestHandlerPanic(t *testing.T) {
	c, _ := newConsumer(t)
	var charged atomic.Int32
	mw, err := idemwatermill.Transactional(c, idemwatermill.Config{RetryDelay: time.Nanosecond})
	h := wrap(t, mw, err, func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := idemwatermill.Tx[*idem.MemoryTx](msg.Context())
		tx.OnCommit(func() { charged.Add(1) })
		panic("boom")
	})
	_, err = h(message.NewMessage("pay-1", nil))
	if !errors.Is(err, idem.ErrHandlerPanic) || idemwatermill.ShouldDeadLetter(err) {
		t.Fatalf("got %v; want a redeliver error matching ErrHandlerPanic", err)
	}
	if charged.Load() != 0 {
		t.Fatal("a panicking handler's effect committed")
	}
}

package idemgocdk_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemgocdk"
	"gocloud.dev/gcerrors"
	"gocloud.dev/pubsub"
	"gocloud.dev/pubsub/driver"
	"gocloud.dev/pubsub/mempubsub"
)

var errBoom = errors.New("boom")

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// TestNewConsumerConfig: what NewConsumer refuses, each with
// idem.ErrInvalidConfig.
func TestNewConsumerConfig(t *testing.T) {
	t.Parallel()
	topic := mempubsub.NewTopic()
	sub := mempubsub.NewSubscription(topic, time.Minute)
	t.Cleanup(func() { _ = sub.Shutdown(context.Background()); _ = topic.Shutdown(context.Background()) })
	p := idem.ProcessorFunc(func(context.Context, idem.Message) (idem.Outcome, error) {
		return idem.Outcome{Status: idem.Processed}, nil
	})
	for _, tt := range []struct {
		name string
		sub  *pubsub.Subscription
		cfg  idemgocdk.Config
	}{
		{"nil subscription", nil, idemgocdk.Config{Processor: p, DeadLetter: topic}},
		{"no Processor", sub, idemgocdk.Config{DeadLetter: topic}},
		{"no DeadLetter", sub, idemgocdk.Config{Processor: p}},
		{"negative Concurrency", sub, idemgocdk.Config{Processor: p, DeadLetter: topic, Concurrency: -1}},
		{"negative RetryDelay", sub, idemgocdk.Config{Processor: p, DeadLetter: topic, RetryDelay: -time.Second}},
	} {
		if _, err := idemgocdk.NewConsumer(tt.sub, tt.cfg); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("%s: NewConsumer error = %v, want idem.ErrInvalidConfig", tt.name, err)
		}
	}
}

// TestProducerSend: the caller's key, a UUIDv7 by default, the same ID
// when the same message is sent again, metadata kept, InjectHeaders unable
// to replace the ID, and an invalid key refused before anything is sent.
func TestProducerSend(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	topic := mempubsub.NewTopic()
	sub := mempubsub.NewSubscription(topic, time.Minute)
	t.Cleanup(func() { _ = sub.Shutdown(context.Background()); _ = topic.Shutdown(context.Background()) })
	p := idemgocdk.NewProducer(idemgocdk.ProducerConfig{InjectHeaders: func(_ context.Context, set func(k, v string)) {
		set("traceparent", "00-x")
		set(idemgocdk.DefaultIDKey, "injected")
	}})

	if _, err := p.Send(ctx, topic, &pubsub.Message{Body: []byte("bad")}, "bad\x00id"); !errors.Is(err, idem.ErrInvalidMessageID) {
		t.Fatalf("Send with a control byte in the ID: %v, want idem.ErrInvalidMessageID", err)
	}
	id1, err := p.Send(ctx, topic, &pubsub.Message{Body: []byte("one"), Metadata: map[string]string{"k": "v"}}, "order-1")
	if err != nil || id1 != "order-1" {
		t.Fatalf("Send(order-1) = %q, %v", id1, err)
	}
	m := &pubsub.Message{Body: []byte("two")}
	id2, err := p.Send(ctx, topic, m, "")
	if err != nil || len(id2) != 36 || id2[14] != '7' {
		t.Fatalf("Send without a key = %q, %v; want a UUIDv7", id2, err)
	}
	again, err := p.Send(ctx, topic, m, "")
	if err != nil || again != id2 {
		t.Fatalf("Send of the same message again = %q, %v; want its ID %q", again, err, id2)
	}

	got := map[string]int{}
	var one *pubsub.Message
	for range 3 {
		r, err := sub.Receive(ctx)
		if err != nil {
			t.Fatal(err)
		}
		r.Ack()
		got[string(r.Body)+"/"+r.Metadata[idemgocdk.DefaultIDKey]]++
		if string(r.Body) == "one" {
			one = r
		}
	}
	if got["one/order-1"] != 1 || got["two/"+id2] != 2 || len(got) != 2 {
		t.Errorf("received %v; want one/order-1 once and two/%s twice", got, id2)
	}
	if one == nil || one.Metadata["k"] != "v" || one.Metadata["traceparent"] != "00-x" {
		t.Errorf("one/order-1's metadata: want k=v and the injected traceparent")
	}
}

// TestMessageIDSources: a message without the ID key is dead-lettered
// (missing-message-id) with its body and metadata, and acked; with
// Config.MessageID set to DriverMessageID it is processed under the
// driver's own ID.
func TestMessageIDSources(t *testing.T) {
	t.Parallel()
	for _, driverID := range []bool{false, true} {
		ctx := t.Context()
		topic, sub, dead, deadSub := memTopics(t)
		seen := make(chan idem.Message, 1)
		cfg := idemgocdk.Config{DeadLetter: dead, Logger: quiet(),
			Processor: idem.Bind(mustConsumer(t), func(ctx context.Context, tx *idem.MemoryTx, m idem.Message) error {
				seen <- m
				return nil
			})}
		if driverID {
			cfg.MessageID = idemgocdk.DriverMessageID
		}
		c, err := idemgocdk.NewConsumer(sub, cfg)
		if err != nil {
			t.Fatal(err)
		}
		done := run(t, c)
		if err := topic.Send(ctx, &pubsub.Message{Body: []byte("no id"), Metadata: map[string]string{"k": "v"}}); err != nil {
			t.Fatal(err)
		}
		if driverID {
			m := <-seen
			if m.ID == "" || string(m.Payload) != "no id" {
				t.Errorf("processed %+v; want the driver's ID and the body", m)
			}
		} else {
			dl, err := deadSub.Receive(ctx)
			if err != nil {
				t.Fatal(err)
			}
			dl.Ack()
			if string(dl.Body) != "no id" || dl.Metadata["k"] != "v" ||
				dl.Metadata[idem.HeaderDeadLetterReason] != idem.ReasonMissingMessageID ||
				dl.Metadata[idemgocdk.MetadataOriginalLoggableID] == "" {
				t.Errorf("dead letter %q %v; want the body, its metadata, reason %q and the original's driver ID", dl.Body, dl.Metadata, idem.ReasonMissingMessageID)
			}
		}
		if err := c.Stop(ctx); err != nil || <-done != nil {
			t.Fatalf("Stop: %v", err)
		}
	}
	if idemgocdk.DriverMessageID(&pubsub.Message{LoggableID: "unknown"}) != "" {
		t.Error(`DriverMessageID of "unknown" (what the Go CDK sets when the driver gave none) is not ""`)
	}
}

// TestRedeliver: a Failed message is nacked after RetryDelay on a driver
// that can nack, not before, and never acked; on a driver that cannot, it
// is neither acked nor nacked (the ack deadline brings it back).
func TestRedeliver(t *testing.T) {
	t.Parallel()
	for _, canNack := range []bool{true, false} {
		synctest.Test(t, func(t *testing.T) {
			d := &scriptDriver{canNack: canNack, msgs: make(chan *driver.Message, 1)}
			sub := pubsub.NewSubscription(d, nil, nil)
			dead := mempubsub.NewTopic()
			defer dead.Shutdown(context.Background())
			failed := make(chan struct{}, 1)
			c, err := idemgocdk.NewConsumer(sub, idemgocdk.Config{DeadLetter: dead, Logger: quiet(), RetryDelay: 5 * time.Second,
				Processor: idem.ProcessorFunc(func(ctx context.Context, m idem.Message) (idem.Outcome, error) {
					failed <- struct{}{}
					return idem.Outcome{Status: idem.Failed, Err: errBoom}, errBoom
				})})
			if err != nil {
				t.Fatal(err)
			}
			done := run(t, c)
			d.msgs <- &driver.Message{AckID: "a1", LoggableID: "m1", Body: []byte("x"),
				Metadata: map[string]string{idemgocdk.DefaultIDKey: "order-1"}, AsFunc: func(any) bool { return false }}
			<-failed
			time.Sleep(4 * time.Second) // fake time, in the bubble
			synctest.Wait()
			if acks, nacks := d.settled(); len(acks)+len(nacks) != 0 {
				t.Fatalf("canNack=%v: before RetryDelay: acks %v, nacks %v; want none", canNack, acks, nacks)
			}
			time.Sleep(2 * time.Second)
			synctest.Wait()
			if err := c.Stop(context.Background()); err != nil || <-done != nil {
				t.Fatalf("Stop: %v", err)
			}
			if err := sub.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			acks, nacks := d.settled()
			want := 0
			if canNack {
				want = 1
			}
			if len(acks) != 0 || len(nacks) != want {
				t.Errorf("canNack=%v: acks %v, nacks %v; want no ack and %d nack", canNack, acks, nacks, want)
			}
		})
	}
}

// scriptDriver is a driver.Subscription that delivers what the test puts
// in msgs and records acks and nacks.
type scriptDriver struct {
	canNack bool
	msgs    chan *driver.Message

	mu          sync.Mutex
	acks, nacks []driver.AckID
}

func (d *scriptDriver) settled() (acks, nacks []driver.AckID) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]driver.AckID(nil), d.acks...), append([]driver.AckID(nil), d.nacks...)
}

func (d *scriptDriver) ReceiveBatch(ctx context.Context, _ int) ([]*driver.Message, error) {
	select {
	case m := <-d.msgs:
		return []*driver.Message{m}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (d *scriptDriver) SendAcks(_ context.Context, ids []driver.AckID) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.acks = append(d.acks, ids...)
	return nil
}

func (d *scriptDriver) SendNacks(_ context.Context, ids []driver.AckID) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.nacks = append(d.nacks, ids...)
	return nil
}

func (d *scriptDriver) CanNack() bool                      { return d.canNack }
func (d *scriptDriver) IsRetryable(error) bool             { return false }
func (d *scriptDriver) As(any) bool                        { return false }
func (d *scriptDriver) ErrorAs(error, any) bool            { return false }
func (d *scriptDriver) ErrorCode(error) gcerrors.ErrorCode { return gcerrors.Unknown }
func (d *scriptDriver) Close() error                       { return nil }

// memTopics returns a mempubsub topic and subscription, and a dead-letter
// topic and its subscription, shut down at cleanup.
func memTopics(t *testing.T) (topic *pubsub.Topic, sub *pubsub.Subscription, dead *pubsub.Topic, deadSub *pubsub.Subscription) {
	topic, dead = mempubsub.NewTopic(), mempubsub.NewTopic()
	sub, deadSub = mempubsub.NewSubscription(topic, time.Minute), mempubsub.NewSubscription(dead, time.Minute)
	t.Cleanup(func() {
		ctx := context.Background()
		_ = sub.Shutdown(ctx)
		_ = deadSub.Shutdown(ctx)
		_ = topic.Shutdown(ctx)
		_ = dead.Shutdown(ctx)
	})
	return topic, sub, dead, deadSub
}

func mustConsumer(t *testing.T) *idem.Consumer[*idem.MemoryTx] {
	c, err := idem.NewConsumer(idem.NewMemoryStore(nil), idem.Config{Name: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// run runs c in a goroutine and returns Run's result.
func run(t *testing.T, c *idemgocdk.Consumer) <-chan error {
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	return done
}

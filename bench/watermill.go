package main

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/idem-go/idem"
)

// wmIDKey is the Watermill metadata key that carries the producer's message
// ID; the Deduplicator keys on it (NewMessageHasherFromMetadataField), not
// on a hash of the payload, so it deduplicates by the same identity idem
// does.
const wmIDKey = "message-id"

// runWatermill runs one "process" of the Watermill contender: a
// message.Router with the Deduplicator middleware over its in-memory
// expiring key repository (watermill v1.5.1 ships no other; watermill-sql
// v4.1.2 has none), fed by wmSubscriber over member m, with handler writing
// the side-effect row as the naive consumer does. It returns nil when ctx
// ends and errCrashed when the crash fault killed it; the next process
// starts with an empty repository, as a restarted process would.
func runWatermill(ctx context.Context, ch channel, m member, handler msgHandler, cfg loopConfig, f *faults, st *runStats) error {
	repo, err := middleware.NewMapExpiringKeyRepository(time.Hour)
	if err != nil {
		return err
	}
	dedup := &middleware.Deduplicator{
		KeyFactory: middleware.NewMessageHasherFromMetadataField(wmIDKey),
		Repository: repo,
		Timeout:    time.Minute,
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	router.AddMiddleware(dedup.Middleware)
	sub := &wmSubscriber{ch: ch, m: m, cfg: cfg, faults: f, stats: st,
		crashed: make(chan struct{}), closing: make(chan struct{})}
	router.AddConsumerHandler("bench", "bench", sub, func(msg *message.Message) error {
		_, err := handler(msg.Context(), idem.Message{ID: msg.Metadata.Get(wmIDKey), Payload: msg.Payload})
		return err
	})
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(context.WithoutCancel(ctx)) }()
	crashed := false
	select {
	case <-ctx.Done():
	case <-sub.crashed:
		crashed = true
	case err := <-runErr:
		return err
	}
	_ = router.Close()
	<-runErr
	if crashed {
		return errCrashed
	}
	return nil
}

// wmSubscriber is a minimal watermill message.Subscriber over a member of
// the harness's broker channel: the same JetStream pull consumer or kgo
// group client the other contenders use, so that every contender pays the
// same broker client costs. It keeps cfg.workers messages in flight (the
// Router handles each in its own goroutine), acknowledges a message the
// Router acked, and on a Nack asks JetStream for a delayed redelivery or, on
// Kafka, sends the message again (as watermill-kafka does).
type wmSubscriber struct {
	ch     channel
	m      member
	cfg    loopConfig
	faults *faults
	stats  *runStats

	crashOnce sync.Once
	crashed   chan struct{}
	closeOnce sync.Once
	closing   chan struct{}
	wg        sync.WaitGroup
}

func (s *wmSubscriber) crash() {
	s.crashOnce.Do(func() {
		s.m.crash()
		close(s.crashed)
	})
}

func (s *wmSubscriber) isCrashed() bool {
	select {
	case <-s.crashed:
		return true
	default:
		return false
	}
}

// Subscribe implements message.Subscriber; topic is ignored (the member is
// bound to its channel).
func (s *wmSubscriber) Subscribe(ctx context.Context, _ string) (<-chan *message.Message, error) {
	out := make(chan *message.Message)
	s.wg.Go(func() {
		defer close(out)
		s.loop(ctx, out)
	})
	return out, nil
}

// Close implements message.Subscriber.
func (s *wmSubscriber) Close() error {
	s.closeOnce.Do(func() { close(s.closing) })
	s.wg.Wait()
	return nil
}

func (s *wmSubscriber) loop(ctx context.Context, out chan<- *message.Message) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.closing:
		case <-s.crashed:
		}
		cancel()
	}()
	var crashed atomic.Bool
	go func() {
		<-s.crashed
		crashed.Store(true)
	}()
	cfg := s.cfg
	cfg.chunk = 1
	_ = pipeline(ctx, s.m, cfg, &crashed, func(unit []delivery) {
		if !s.isCrashed() {
			s.deliver(ctx, out, unit[0])
		}
	})
}

// deliver hands d to the Router and settles it as the Router says.
func (s *wmSubscriber) deliver(ctx context.Context, out chan<- *message.Message, d delivery) {
	for {
		start := time.Now()
		s.stats.started(start)
		msg := message.NewMessage(d.id, d.payload)
		msg.Metadata.Set(wmIDKey, d.id)
		msg.SetContext(context.WithoutCancel(ctx))
		select {
		case out <- msg:
		case <-ctx.Done():
			return
		}
		select {
		case <-msg.Acked():
			if s.faults.crashNow(d.id) {
				s.crash()
				return
			}
			if !s.isCrashed() && d.ack() == nil {
				s.stats.ack(start)
			}
			return
		case <-msg.Nacked():
			if s.isCrashed() {
				return
			}
			if !s.ch.retryInPlace() {
				_ = d.nak(s.cfg.retryDelay)
				return
			}
			select {
			case <-time.After(s.cfg.retryDelay):
			case <-ctx.Done():
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemnats"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsBroker is an in-process JetStream server (memory storage, no network
// listener); clients connect through nats.InProcessServer.
type natsBroker struct {
	srv *server.Server
	nc  *nats.Conn // for publishing and stream administration
	js  jetstream.JetStream
}

func newNATSBroker() (*natsBroker, error) {
	srv, err := server.NewServer(&server.Options{
		JetStream: true, StoreDir: "", DontListen: true, NoSigs: true, NoLog: true,
		ServerName: "idem-bench", JetStreamMaxMemory: 1 << 30,
	})
	if err != nil {
		return nil, fmt.Errorf("in-process NATS: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		srv.Shutdown()
		return nil, errors.New("in-process NATS server did not start in 30s")
	}
	b := &natsBroker{srv: srv}
	if b.nc, err = nats.Connect("", nats.InProcessServer(srv)); err != nil {
		b.close()
		return nil, err
	}
	if b.js, err = jetstream.New(b.nc); err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

func (b *natsBroker) name() string { return "nats" }

func (b *natsBroker) close() {
	if b.nc != nil {
		b.nc.Close()
	}
	b.srv.Shutdown()
	b.srv.WaitForShutdown()
}

func (b *natsBroker) newChannel(ctx context.Context, tag string, ackWait time.Duration) (channel, error) {
	c := &natsChannel{b: b, tag: tag, stream: "BENCH_" + tag, subject: "bench." + tag}
	_, err := b.js.CreateStream(ctx, jetstream.StreamConfig{
		Name:     c.stream,
		Subjects: []string{c.subject},
		Storage:  jetstream.MemoryStorage,
		// JetStream drops a publish whose Nats-Msg-Id it saw within this
		// window; 100ms is its minimum. The harness republishes a copy the
		// window dropped, so the duplicates reach the consumer, as a
		// producer's retry after the window would.
		Duplicates: 100 * time.Millisecond,
	})
	if err != nil {
		return nil, fmt.Errorf("NATS: create stream: %w", err)
	}
	c.cons, err = b.js.CreateOrUpdateConsumer(ctx, c.stream, jetstream.ConsumerConfig{
		Durable:       "bench",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
		MaxAckPending: 100000,
		MaxDeliver:    -1,
	})
	if err != nil {
		return nil, fmt.Errorf("NATS: create consumer: %w", err)
	}
	return c, nil
}

type natsChannel struct {
	b               *natsBroker
	tag             string
	stream, subject string
	outStream       string // the outgoing stream, once made
	cons            jetstream.Consumer
}

func (c *natsChannel) publish(ctx context.Context, id string, payload []byte) (bool, error) {
	ack, err := c.b.js.Publish(ctx, c.subject, payload, jetstream.WithMsgID(id))
	if err != nil {
		return false, err
	}
	return ack.Duplicate, nil
}

func (c *natsChannel) retryInPlace() bool { return false }

func (c *natsChannel) settled(ctx context.Context) (bool, error) {
	info, err := c.cons.Info(ctx)
	if err != nil {
		return false, err
	}
	return info.NumPending == 0 && info.NumAckPending == 0, nil
}

func (c *natsChannel) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = c.b.js.DeleteStream(ctx, c.stream)
	if c.outStream != "" {
		_ = c.b.js.DeleteStream(ctx, c.outStream)
	}
}

func (c *natsChannel) outgoing(ctx context.Context) (string, idem.Publisher, func(context.Context) (int, error), error) {
	c.outStream = "OUT_" + c.tag
	subject := "out." + c.tag
	s, err := c.b.js.CreateStream(ctx, jetstream.StreamConfig{
		Name: c.outStream, Subjects: []string{subject}, Storage: jetstream.MemoryStorage,
	})
	if err != nil {
		return "", nil, nil, fmt.Errorf("NATS: create outgoing stream: %w", err)
	}
	held := func(ctx context.Context) (int, error) {
		info, err := s.Info(ctx)
		if err != nil {
			return 0, err
		}
		return int(info.State.Msgs), nil
	}
	return subject, idemnats.NewPublisher(c.b.js), held, nil
}

// member connects a new client, as a new process would, and pulls from the
// channel's durable consumer.
func (c *natsChannel) member(ctx context.Context) (member, error) {
	nc, err := nats.Connect("", nats.InProcessServer(c.b.srv))
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	cons, err := js.Consumer(ctx, c.stream, "bench")
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &natsMember{nc: nc, cons: cons}, nil
}

type natsMember struct {
	nc      *nats.Conn
	cons    jetstream.Consumer
	crashed atomic.Bool
}

func (m *natsMember) fetch(ctx context.Context, max int) ([]delivery, error) {
	if m.crashed.Load() {
		return nil, errCrashed
	}
	batch, err := m.cons.FetchNoWait(max)
	if err != nil {
		return nil, err
	}
	var out []delivery
	for msg := range batch.Messages() {
		out = append(out, delivery{
			id:      msg.Headers().Get(jetstream.MsgIDHeader),
			payload: msg.Data(),
			ack: func() error {
				if m.crashed.Load() {
					return errCrashed
				}
				return msg.Ack()
			},
			nak: func(d time.Duration) error {
				if m.crashed.Load() {
					return errCrashed
				}
				return msg.NakWithDelay(d)
			},
		})
	}
	if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && len(out) == 0 {
		return nil, err
	}
	return out, nil
}

func (m *natsMember) commit(context.Context, []delivery) error { return nil }

func (m *natsMember) crash() {
	m.crashed.Store(true)
	m.nc.Close()
}

func (m *natsMember) stop(context.Context) {
	if !m.crashed.Load() {
		_ = m.nc.Drain()
	}
}

package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsBus is --sidecar on a JetStream server (envNATS).
type natsBus struct {
	natsURL string
	nc      *nats.Conn
	js      jetstream.JetStream
}

func newNATSBus(natsURL string) (*natsBus, error) {
	nc, err := nats.Connect(natsURL)
	if err != nil {
		return nil, fmt.Errorf("NATS: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &natsBus{natsURL: natsURL, nc: nc, js: js}, nil
}

func (b *natsBus) url() string { return b.natsURL }
func (b *natsBus) close()      { b.nc.Close() }

// publish makes a file-backed stream for the run and publishes n
// messages to it, each with its ID as Nats-Msg-Id, waiting for every ack.
func (b *natsBus) publish(ctx context.Context, tag string, n int, payload []byte) (stream, subject string, cleanup func(), err error) {
	stream, subject = strings.ToUpper(tag), "bench."+tag
	if _, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subject}, Storage: jetstream.FileStorage}); err != nil {
		return "", "", nil, fmt.Errorf("create stream: %w", err)
	}
	cleanup = func() { _ = b.js.DeleteStream(context.WithoutCancel(ctx), stream) }
	var pubErr error
	futures := make([]jetstream.PubAckFuture, 0, n)
	for i := range n {
		f, err := b.js.PublishMsgAsync(&nats.Msg{Subject: subject, Data: payload,
			Header: nats.Header{nats.MsgIdHdr: []string{fmt.Sprintf("%s-%d", tag, i)}}})
		if err != nil {
			cleanup()
			return "", "", nil, fmt.Errorf("publish: %w", err)
		}
		futures = append(futures, f)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			pubErr = errors.Join(pubErr, err)
		case <-ctx.Done():
			cleanup()
			return "", "", nil, ctx.Err()
		}
	}
	if pubErr != nil {
		cleanup()
		return "", "", nil, fmt.Errorf("publish: %w", pubErr)
	}
	return stream, subject, cleanup, nil
}

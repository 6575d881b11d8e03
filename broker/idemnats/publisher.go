package idemnats

import (
	"context"
	"errors"
	"fmt"

	"github.com/idem-go/idem"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NewPublisher returns the outbox relay's idem.Publisher for JetStream:
// each outgoing message goes to the subject in its Destination, with its
// ID in the Nats-Msg-Id header (so the stream's duplicate window drops a
// re-send, and the consumer adapter reads it as the message ID; opts as
// for NewProducer, WithIDHeader adds a second ID header) and its Headers
// copied. Outgoing.Key is not used: JetStream keeps a subject's order.
//
// A batch is published asynchronously (PublishMsgAsync) and then every
// PubAck is awaited, until ctx ends. A message counts as sent only on its
// PubAck (a duplicate within the window is acked too). An ID NATS cannot
// carry, an invalid subject, or a payload over the server's maximum comes
// back wrapped with idem.Permanent; anything else (no stream for the
// subject, no PubAck before ctx ends, a lost connection) is retryable.
// The publisher is safe for concurrent use; js stays the caller's.
func NewPublisher(js jetstream.JetStream, opts ...ProducerOption) idem.Publisher {
	return natsPublisher{p: NewProducer(js, opts...)}
}

type natsPublisher struct{ p *Producer }

// Publish implements idem.Publisher.
func (n natsPublisher) Publish(ctx context.Context, msgs []idem.Outgoing) []error {
	errs := make([]error, len(msgs))
	futures := make([]jetstream.PubAckFuture, len(msgs))
	for i, m := range msgs {
		var h nats.Header
		if len(m.Headers) > 0 {
			h = make(nats.Header, len(m.Headers))
			for k, v := range m.Headers {
				h[k] = []string{v}
			}
		}
		msg, err := n.p.message(m.Destination, m.ID, m.Payload, h)
		if err != nil {
			errs[i] = idem.Permanent(err)
			continue
		}
		f, err := n.p.js.PublishMsgAsync(msg, jetstream.WithMsgID(m.ID))
		if err != nil {
			errs[i] = classify(m, err)
			continue
		}
		futures[i] = f
	}
	for i, f := range futures {
		if f == nil {
			continue
		}
		select {
		case <-f.Ok():
		case err := <-f.Err():
			errs[i] = classify(msgs[i], err)
		case <-ctx.Done():
			errs[i] = fmt.Errorf("idemnats: publish %q to %s: no PubAck: %w", msgs[i].ID, msgs[i].Destination, ctx.Err())
		}
	}
	return errs
}

// classify wraps a publish error: permanent when no retry can succeed.
func classify(m idem.Outgoing, err error) error {
	err = fmt.Errorf("idemnats: publish %q to %s: %w", m.ID, m.Destination, err)
	if errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, nats.ErrBadSubject) {
		return idem.Permanent(err)
	}
	return err
}

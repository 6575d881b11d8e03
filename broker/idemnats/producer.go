package idemnats

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/idem-go/idem"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Producer publishes messages to JetStream with a stable message ID in the
// Nats-Msg-Id header, so the server drops a re-publish within the stream's
// duplicate window (StreamConfig.Duplicates, 2 minutes by default) and idem
// deduplicates whatever gets through.
type Producer struct {
	js       jetstream.JetStream
	idHeader string
	inject   idem.HeaderInjector
}

// ProducerOption configures a Producer.
type ProducerOption func(*Producer)

// WithIDHeader makes the Producer also write the message ID to header name,
// for consumers whose Config.IDHeader is not Nats-Msg-Id. Nats-Msg-Id is
// always set.
func WithIDHeader(name string) ProducerOption {
	return func(p *Producer) { p.idHeader = name }
}

// NewProducer returns a Producer that publishes with js.
func NewProducer(js jetstream.JetStream, opts ...ProducerOption) *Producer {
	p := &Producer{js: js}
	for _, o := range opts {
		o(p)
	}
	return p
}

// PublishOption configures one Publish.
type PublishOption func(*publishOptions)

type publishOptions struct {
	id     string
	idSet  bool
	header nats.Header
}

// WithMessageID publishes with id, a business key (an order number, an
// upstream event ID), instead of a new UUIDv7. Use it whenever the
// message has a natural identity: a producer retrying after a crash then
// publishes the same ID again, which a fresh UUID would not.
func WithMessageID(id string) PublishOption {
	return func(o *publishOptions) { o.id, o.idSet = id, true }
}

// WithHeader adds headers to the published message. Its Nats-Msg-Id, if
// any, is replaced by the message ID.
func WithHeader(h nats.Header) PublishOption {
	return func(o *publishOptions) { o.header = h }
}

// Publish publishes payload to subject with a message ID and returns the
// ID once JetStream has stored the message (or dropped it as a duplicate
// of an earlier publish of the same ID within the duplicate window, which
// is success too). The ID is a new UUIDv7 (uuid.NewV7) unless WithMessageID
// gives one; an ID idem would reject, or one with a leading or trailing
// space (NATS trims header values, so it would reach consumers as another
// ID), returns an error matching idem.ErrMissingMessageID or
// idem.ErrInvalidMessageID, before publishing.
// JetStream errors (no stream for the subject, timeouts) are returned
// wrapped; retrying with the same ID is safe.
func (p *Producer) Publish(ctx context.Context, subject string, payload []byte, opts ...PublishOption) (string, error) {
	var o publishOptions
	for _, opt := range opts {
		opt(&o)
	}
	if !o.idSet {
		u, err := uuid.NewV7()
		if err != nil {
			return "", fmt.Errorf("idemnats: new message ID: %w", err)
		}
		o.id = u.String()
	}
	msg, err := p.message(subject, o.id, payload, o.header)
	if err != nil {
		return "", err
	}
	p.injectHeaders(ctx, msg)
	if _, err := p.js.PublishMsg(ctx, msg, jetstream.WithMsgID(o.id)); err != nil {
		return "", fmt.Errorf("idemnats: publish %q to %s: %w", o.id, subject, err)
	}
	return o.id, nil
}

// message builds the message Publish and the relay's Publisher send: the
// payload, a copy of header, and id in Nats-Msg-Id (and the Producer's ID
// header). An id idem would reject, or one with a leading or trailing
// space, returns an error matching idem.ErrMissingMessageID or
// idem.ErrInvalidMessageID.
func (p *Producer) message(subject, id string, payload []byte, header nats.Header) (*nats.Msg, error) {
	if err := idem.ValidateMessageID(id, 0); err != nil {
		return nil, fmt.Errorf("idemnats: publish to %s: %w", subject, err)
	}
	if id[0] == ' ' || id[len(id)-1] == ' ' {
		// NATS trims the spaces around a header value: " a" would arrive
		// as "a", another ID.
		return nil, fmt.Errorf("idemnats: publish to %s: %w: %q has a leading or trailing space, which a NATS header does not carry", subject, idem.ErrInvalidMessageID, id)
	}
	msg := nats.NewMsg(subject)
	msg.Data = payload
	for k, vs := range header {
		msg.Header[k] = append([]string(nil), vs...)
	}
	msg.Header.Set(jetstream.MsgIDHeader, id)
	if p.idHeader != "" && p.idHeader != jetstream.MsgIDHeader {
		msg.Header.Set(p.idHeader, id)
	}
	return msg, nil
}

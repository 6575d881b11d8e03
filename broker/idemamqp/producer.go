package idemamqp

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/google/uuid"
	"github.com/idem-go/idem"
	amqp "github.com/rabbitmq/amqp091-go"
)

// ErrPublishUnroutable means the broker returned a published message as
// unroutable: no queue is bound to the exchange with that routing key (for
// the default exchange, the queue does not exist). The message was not
// stored.
var ErrPublishUnroutable = errors.New("idemamqp: message unroutable")

// ProducerConfig configures a Producer. The zero value publishes to the
// default exchange with the ID in the message_id property.
type ProducerConfig struct {
	// Exchange is the exchange to publish to. Defaults to "" (the default
	// exchange, where the routing key is the queue name).
	Exchange string
	// IDHeader, when set, also puts the message ID in this header, for
	// consumers configured with the same Config.IDHeader. The message_id
	// property is always set.
	IDHeader string
}

// Producer publishes messages with a stable message ID, persistent and
// with publisher confirms. It is safe for concurrent use; publishes are
// serialised on one channel so that each waits for its own confirm and
// sees its own return.
type Producer struct {
	conn *amqp.Connection
	cfg  ProducerConfig

	mu      sync.Mutex
	ch      *amqp.Channel
	returns chan amqp.Return
	closed  bool
}

// NewProducer returns a Producer on the caller's conn. It opens its
// channel on the first Publish, and again after that channel is closed;
// Close closes it. It never closes conn.
func NewProducer(conn *amqp.Connection, cfg ProducerConfig) *Producer {
	return &Producer{conn: conn, cfg: cfg}
}

// PublishOption sets an option of one Publish call.
type PublishOption func(*publishOptions)

type publishOptions struct {
	id          string
	idSet       bool
	headers     amqp.Table
	contentType string
}

// WithMessageID publishes with id (a business key, such as an order number
// and event kind) instead of a new UUIDv7. It must follow idem's ID rules
// (idem.ValidateMessageID); Publish returns an error matching
// idem.ErrInvalidMessageID or idem.ErrMissingMessageID otherwise.
func WithMessageID(id string) PublishOption {
	return func(o *publishOptions) { o.id, o.idSet = id, true }
}

// WithHeaders adds headers to the message.
func WithHeaders(h amqp.Table) PublishOption {
	return func(o *publishOptions) { o.headers = h }
}

// WithContentType sets the content_type property, such as
// "application/json".
func WithContentType(ct string) PublishOption {
	return func(o *publishOptions) { o.contentType = ct }
}

// Publish publishes payload to the Producer's exchange with routingKey
// (the queue name on the default exchange), as a persistent message with
// the message ID in the message_id property, and waits for the broker's
// confirm. It returns the message ID: a new UUIDv7 unless WithMessageID
// gave one. Publishing again with the same ID (after an error whose outcome
// is unknown, such as a lost confirm) is what makes a retry safe: the
// consumer sees a duplicate.
//
// Errors: an invalid WithMessageID (idem.ErrInvalidMessageID,
// idem.ErrMissingMessageID); ErrConnectionClosed when the connection is
// closed; ErrPublishUnroutable when nothing took the message; the broker's
// nack; ctx's error. The message may have been stored when the confirm was
// lost; retry with the returned ID.
func (p *Producer) Publish(ctx context.Context, routingKey string, payload []byte, opts ...PublishOption) (string, error) {
	var o publishOptions
	for _, opt := range opts {
		opt(&o)
	}
	id := o.id
	if !o.idSet {
		v, err := uuid.NewV7()
		if err != nil {
			return "", err
		}
		id = v.String()
	}
	msg, err := p.publishing(id, payload, o.headers, o.contentType)
	if err != nil {
		return "", err
	}
	return id, p.publish(ctx, routingKey, msg)
}

func (p *Producer) publish(ctx context.Context, key string, msg amqp.Publishing) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.channel(); err != nil {
		return err
	}
	conf, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, p.cfg.Exchange, key, true, false, msg)
	if err != nil {
		return err
	}
	ok, err := conf.WaitContext(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("idemamqp: the broker nacked message %s", msg.MessageId)
	}
	select {
	case r := <-p.returns:
		return fmt.Errorf("%w: exchange %q routing key %q: %d %s", ErrPublishUnroutable, p.cfg.Exchange, key, r.ReplyCode, r.ReplyText)
	default:
	}
	return nil
}

// channel opens the Producer's channel in confirm mode if it is not open,
// and drops returns left from earlier publishes. p.mu must be held. Errors:
// ErrConnectionClosed when the Producer or the connection is closed, or
// the broker's error opening the channel.
func (p *Producer) channel() error {
	if p.closed {
		return fmt.Errorf("%w: producer closed", ErrConnectionClosed)
	}
	if p.ch == nil || p.ch.IsClosed() {
		if p.conn == nil || p.conn.IsClosed() {
			return ErrConnectionClosed
		}
		ch, err := p.conn.Channel()
		if err != nil {
			return err
		}
		if err := ch.Confirm(false); err != nil {
			_ = ch.Close()
			return err
		}
		p.ch, p.returns = ch, ch.NotifyReturn(make(chan amqp.Return, 1))
	}
	for len(p.returns) > 0 {
		<-p.returns
	}
	return nil
}

// publishing builds the message of Publish and of the relay's Publisher:
// persistent, id in the message_id property (and the IDHeader), headers
// copied. An id idem would reject returns an error matching
// idem.ErrInvalidMessageID or idem.ErrMissingMessageID.
func (p *Producer) publishing(id string, payload []byte, extra amqp.Table, contentType string) (amqp.Publishing, error) {
	if err := idem.ValidateMessageID(id, 0); err != nil {
		return amqp.Publishing{}, err
	}
	headers := amqp.Table{}
	for k, v := range extra {
		headers[k] = v
	}
	if p.cfg.IDHeader != "" {
		headers[p.cfg.IDHeader] = id
	}
	if len(headers) == 0 {
		headers = nil
	}
	return amqp.Publishing{
		Headers:      headers,
		ContentType:  contentType,
		DeliveryMode: amqp.Persistent,
		MessageId:    id,
		Body:         payload,
	}, nil
}

// Close closes the Producer's channel. Later Publish calls fail. It is
// idempotent and never closes the connection.
func (p *Producer) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if p.ch != nil && !p.ch.IsClosed() {
		return p.ch.Close()
	}
	return nil
}

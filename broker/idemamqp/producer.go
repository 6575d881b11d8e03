package idemamqp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
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
	// Redial returns a new connection after the current one closed
	// (network loss, broker restart), as Config.Redial does for a
	// Consumer; it is the place to declare again the topology the
	// Producer publishes to. Publish calls it, with exponential backoff
	// between failed calls up to MaxReconnectInterval, until it succeeds
	// or Publish's context ends. The Producer owns the connections Redial
	// returns and closes them on Close; it never closes the one given to
	// NewProducer. Nil means Publish on a closed connection fails with
	// ErrConnectionClosed. A connection with amqp091's automatic Recovery
	// is refused.
	Redial func(ctx context.Context) (*amqp.Connection, error)
	// MaxReconnectInterval is the longest wait between two Redial calls.
	// Defaults to DefaultMaxReconnectInterval (30s).
	MaxReconnectInterval time.Duration
	// InjectHeaders, when set, is called on every Publish to add headers
	// from the publishing context (idemotel.InjectTraceContext writes the
	// W3C trace context, so the consumer's process span continues the
	// producer's trace). It cannot replace the IDHeader.
	InjectHeaders idem.HeaderInjector
}

// Producer publishes messages with a stable message ID, persistent and
// with publisher confirms. It is safe for concurrent use; publishes are
// serialised on one channel so that each waits for its own confirm and
// sees its own return.
type Producer struct {
	conn  *amqp.Connection
	owned bool // conn came from Redial: Close closes it
	cfg   ProducerConfig

	mu      sync.Mutex
	ch      *amqp.Channel
	returns chan amqp.Return
	closed  bool
}

// NewProducer returns a Producer on the caller's conn. It opens its
// channel on the first Publish, and again after that channel is closed;
// Close closes it. It never closes conn. With ProducerConfig.Redial, a
// Publish after conn closed gets a new connection first.
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
// closed and ProducerConfig.Redial is nil; ErrPublishUnroutable when
// nothing took the message; the broker's nack; ctx's error (also while
// Redial keeps failing; the last Redial error is wrapped with it). The message may have been stored when the confirm was
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
	p.injectHeaders(ctx, &msg)
	return id, p.publish(ctx, routingKey, msg)
}

func (p *Producer) publish(ctx context.Context, key string, msg amqp.Publishing) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.channel(ctx); err != nil {
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

// redial replaces the closed connection with one from Config.Redial,
// retrying with exponential backoff until ctx ends. p.mu is held.
func (p *Producer) redial(ctx context.Context) error {
	if p.owned {
		_ = p.conn.Close()
	}
	p.conn, p.owned, p.ch = nil, false, nil
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 100 * time.Millisecond
	bo.MaxInterval = cmp.Or(p.cfg.MaxReconnectInterval, DefaultMaxReconnectInterval)
	conn, err := backoff.Retry(ctx, func() (*amqp.Connection, error) {
		conn, err := p.cfg.Redial(ctx)
		switch {
		case err != nil:
			return nil, err
		case conn == nil:
			return nil, errors.New("Redial returned no connection")
		case conn.IsRecoveryEnabled():
			_ = conn.Close()
			return nil, backoff.Permanent(fmt.Errorf("%w: idemamqp: Redial returned a connection with automatic Recovery", idem.ErrInvalidConfig))
		}
		return conn, nil
	}, backoff.WithBackOff(bo), backoff.WithMaxElapsedTime(0))
	if err != nil {
		return fmt.Errorf("%w: redial: %w", ErrConnectionClosed, err)
	}
	p.conn, p.owned = conn, true
	return nil
}

// channel opens the Producer's channel in confirm mode if it is not open,
// and drops returns left from earlier publishes. p.mu must be held. Errors:
// ErrConnectionClosed when the Producer is closed, or the connection is
// closed and there is no Config.Redial (or it did not succeed before ctx
// ended), or the broker's error opening the channel.
func (p *Producer) channel(ctx context.Context) error {
	if p.closed {
		return fmt.Errorf("%w: producer closed", ErrConnectionClosed)
	}
	// amqp091 marks a connection closed before it closes the connection's
	// channels: a channel that still looks open on a closed connection is
	// as dead as a closed one.
	connClosed := p.conn == nil || p.conn.IsClosed()
	if p.ch == nil || p.ch.IsClosed() || connClosed {
		if connClosed {
			if p.cfg.Redial == nil {
				return ErrConnectionClosed
			}
			if err := p.redial(ctx); err != nil {
				return err
			}
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

// Close closes the Producer's channel, and the connection it got from
// Config.Redial if any. Later Publish calls fail. It is idempotent and
// never closes the connection given to NewProducer.
func (p *Producer) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	var err error
	if p.ch != nil && !p.ch.IsClosed() {
		err = p.ch.Close()
	}
	if p.owned {
		_ = p.conn.Close()
		p.owned = false
	}
	return err
}

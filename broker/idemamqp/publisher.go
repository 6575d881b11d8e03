package idemamqp

import (
	"context"
	"fmt"

	"github.com/idem-go/idem"
	amqp "github.com/rabbitmq/amqp091-go"
)

// NewPublisher returns the outbox relay's idem.Publisher for RabbitMQ.
// Each outgoing message is published to cfg.Exchange (the default
// exchange when empty) with its Destination as the routing key: on the
// default exchange that is the name of the queue; on another exchange it
// is matched against that exchange's bindings. The message is persistent,
// carries its ID in the message_id property (where the consumer adapter
// reads it; also in cfg.IDHeader when set) and its Headers as headers.
// Outgoing.Key is not used: a queue keeps its order.
//
// A batch is published on one confirm-mode channel, mandatory, and then
// every publisher confirm is awaited; a message counts as sent only when
// the broker acked it and did not return it. An ID idem would reject comes
// back wrapped with idem.Permanent. Everything else is retryable: a
// returned message (ErrPublishUnroutable: no queue bound for the routing
// key, which may yet be created), a nack, a closed channel or connection
// (ErrConnectionClosed), no confirm before ctx ends. Publishes of one
// publisher are serialised on its channel, which it opens on first use
// and reopens after it closes; conn stays the caller's, and Close closes
// the channel (and the connections cfg.Redial returned).
func NewPublisher(conn *amqp.Connection, cfg ProducerConfig) *Publisher {
	return &Publisher{p: NewProducer(conn, cfg)}
}

// Publisher is the outbox relay's idem.Publisher for RabbitMQ; see
// NewPublisher.
type Publisher struct{ p *Producer }

var _ idem.Publisher = (*Publisher)(nil)

// Close closes the publisher's channel, and the connection it got from
// ProducerConfig.Redial if any, as Producer.Close does; later Publish
// calls fail with an error matching ErrConnectionClosed. It is idempotent
// and never closes the connection given to NewPublisher.
func (a *Publisher) Close() error { return a.p.Close() }

// Publish implements idem.Publisher.
func (a *Publisher) Publish(ctx context.Context, msgs []idem.Outgoing) []error {
	p := a.p
	errs := make([]error, len(msgs))
	fail := func(i int, err error) {
		errs[i] = fmt.Errorf("idemamqp: publish %q to exchange %q routing key %q: %w", msgs[i].ID, p.cfg.Exchange, msgs[i].Destination, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.channel(ctx); err != nil {
		for i := range msgs {
			fail(i, err)
		}
		return errs
	}
	confs := make([]*amqp.DeferredConfirmation, len(msgs))
	for i, m := range msgs {
		var headers amqp.Table
		if len(m.Headers) > 0 {
			headers = make(amqp.Table, len(m.Headers))
			for k, v := range m.Headers {
				headers[k] = v
			}
		}
		msg, err := p.publishing(m.ID, m.Payload, headers, "")
		if err != nil {
			fail(i, err)
			errs[i] = idem.Permanent(errs[i])
			continue
		}
		confs[i], err = p.ch.PublishWithDeferredConfirmWithContext(ctx, p.cfg.Exchange, m.Destination, true, false, msg)
		if err != nil {
			fail(i, err)
		}
	}
	// Returns come before their message's confirm; read them while
	// waiting, as the return channel holds one.
	returned := map[string]amqp.Return{}
	returns := p.returns // nil once closed with the channel
	for i, c := range confs {
		if c == nil {
			continue
		}
	wait:
		for {
			select {
			case <-c.Done():
				break wait
			case r, ok := <-returns:
				if !ok {
					returns = nil
					continue
				}
				returned[r.MessageId] = r
			case <-ctx.Done():
				fail(i, fmt.Errorf("no publisher confirm: %w", ctx.Err()))
				confs[i] = nil
				break wait
			}
		}
		if confs[i] != nil && !c.Acked() {
			fail(i, fmt.Errorf("the broker nacked the message or closed the channel"))
		}
	}
	for len(p.returns) > 0 {
		r := <-p.returns
		returned[r.MessageId] = r
	}
	for i, m := range msgs {
		if r, ok := returned[m.ID]; ok && errs[i] == nil {
			fail(i, fmt.Errorf("%w: %d %s", ErrPublishUnroutable, r.ReplyCode, r.ReplyText))
		}
	}
	return errs
}

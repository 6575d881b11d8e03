package idemredisstream

import (
	"context"
	"fmt"

	"github.com/idem-go/idem"
	"github.com/redis/go-redis/v9"
)

// NewPublisher returns the outbox relay's idem.Publisher for Redis
// Streams: each outgoing message is appended (XADD) to the stream named by
// its Destination, with its ID in cfg.IDField (DefaultIDField,
// "message-id", where the consumer adapter reads it), its payload in
// cfg.PayloadField and its Headers as further fields (never replacing
// those two). Outgoing.Key is not used: a stream keeps its order.
//
// A batch goes out in one pipeline; a message counts as sent on its XADD
// reply. An ID idem would reject comes back wrapped with idem.Permanent;
// every other error (the connection, a key of another type, ctx ending) is
// retryable. The publisher is safe for concurrent use; rdb stays the
// caller's.
func NewPublisher(rdb redis.UniversalClient, cfg ProducerConfig) idem.Publisher {
	return redisPublisher{p: NewProducer(rdb, cfg)}
}

type redisPublisher struct{ p *Producer }

// Publish implements idem.Publisher.
func (r redisPublisher) Publish(ctx context.Context, msgs []idem.Outgoing) []error {
	errs := make([]error, len(msgs))
	cmds := make([]*redis.StringCmd, len(msgs))
	pipe := r.p.rdb.Pipeline()
	for i, m := range msgs {
		args, err := r.p.xaddArgs(m.Destination, m.ID, m.Payload, m.Headers)
		if err != nil {
			errs[i] = idem.Permanent(fmt.Errorf("idemredisstream: publish to %s: %w", m.Destination, err))
			continue
		}
		cmds[i] = pipe.XAdd(ctx, args)
	}
	if pipe.Len() > 0 {
		_, _ = pipe.Exec(ctx) // each command carries its own error
	}
	for i, c := range cmds {
		if c == nil {
			continue
		}
		if err := c.Err(); err != nil {
			errs[i] = fmt.Errorf("idemredisstream: publish %q to %s: %w", msgs[i].ID, msgs[i].Destination, err)
		}
	}
	return errs
}

package idemgocdk

import (
	"context"
	"maps"

	"github.com/google/uuid"
	"github.com/idem-go/idem"
	"gocloud.dev/pubsub"
)

// ProducerConfig configures a Producer. The zero value writes the message
// ID under DefaultIDKey.
type ProducerConfig struct {
	// IDKey is the metadata key for the message ID. Defaults to
	// DefaultIDKey; it must match the Consumer's Config.IDKey.
	IDKey string
	// InjectHeaders, when set, is called on every Send to add metadata
	// from the sending context (idemotel.InjectTraceContext writes the W3C
	// trace context, so the consumer's process span continues the
	// producer's trace). It cannot replace the ID key.
	InjectHeaders idem.HeaderInjector
}

// Producer sends messages with a stable message ID in their metadata on Go
// CDK topics. It is safe for concurrent use.
type Producer struct {
	cfg ProducerConfig
}

// NewProducer returns a Producer.
func NewProducer(cfg ProducerConfig) *Producer {
	if cfg.IDKey == "" {
		cfg.IDKey = DefaultIDKey
	}
	return &Producer{cfg: cfg}
}

// Send sends m on topic with the message ID in m.Metadata[IDKey], and
// returns the ID. The ID is id, the caller's business key (such as an
// order number and event kind), when not empty; otherwise the one m
// already carries under IDKey, so that sending the same *pubsub.Message
// again after an error keeps its ID; otherwise a new UUIDv7. Send replaces
// m.Metadata with a copy holding the ID and what
// ProducerConfig.InjectHeaders writes, and returns once the driver has
// the message (pubsub.Topic.Send). Sending again with the same ID, after
// an error whose outcome is unknown, is what makes a retry safe: the
// consumer sees a duplicate.
//
// Errors: an ID idem would reject (idem.ErrInvalidMessageID; see
// idem.ValidateMessageID), or the topic's error (gcerrors.Code reads its
// code).
func (p *Producer) Send(ctx context.Context, topic *pubsub.Topic, m *pubsub.Message, id string) (string, error) {
	if id == "" {
		id = m.Metadata[p.cfg.IDKey]
	}
	if id == "" {
		v, err := uuid.NewV7()
		if err != nil {
			return "", err
		}
		id = v.String()
	}
	if err := idem.ValidateMessageID(id, 0); err != nil {
		return "", err
	}
	md := make(map[string]string, len(m.Metadata)+1)
	maps.Copy(md, m.Metadata)
	if p.cfg.InjectHeaders != nil {
		p.cfg.InjectHeaders(ctx, func(k, v string) { md[k] = v })
	}
	md[p.cfg.IDKey] = id
	m.Metadata = md
	return id, topic.Send(ctx, m)
}

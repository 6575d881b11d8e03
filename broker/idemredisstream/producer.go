package idemredisstream

import (
	"context"

	"github.com/google/uuid"
	"github.com/idem-go/idem"
	"github.com/redis/go-redis/v9"
)

// ProducerConfig configures a Producer. The zero value writes the message
// ID to DefaultIDField and the payload to DefaultPayloadField.
type ProducerConfig struct {
	// IDField is the field for the message ID. Defaults to DefaultIDField.
	IDField string
	// PayloadField is the field for the payload. Defaults to
	// DefaultPayloadField.
	PayloadField string
	// MaxLen, when positive, trims the stream to about MaxLen entries on
	// each publish (XADD MAXLEN ~). Trimming drops entries whether or not
	// a group has read them; keep it well above the backlog.
	MaxLen int64
	// InjectHeaders, when set, is called on every Publish to add fields
	// from the publishing context (idemotel.InjectTraceContext writes the
	// W3C trace context, so the consumer's process span continues the
	// producer's trace). It cannot replace the ID and payload fields.
	InjectHeaders idem.HeaderInjector
}

// Producer appends entries with a stable message ID to streams. It is safe
// for concurrent use.
type Producer struct {
	rdb redis.UniversalClient
	cfg ProducerConfig
}

// NewProducer returns a Producer on the caller's client.
func NewProducer(rdb redis.UniversalClient, cfg ProducerConfig) *Producer {
	if cfg.IDField == "" {
		cfg.IDField = DefaultIDField
	}
	if cfg.PayloadField == "" {
		cfg.PayloadField = DefaultPayloadField
	}
	return &Producer{rdb: rdb, cfg: cfg}
}

// PublishOption sets an option of one Publish call.
type PublishOption func(*publishOptions)

type publishOptions struct {
	id     string
	idSet  bool
	fields map[string]string
}

// WithMessageID publishes with id (a business key, such as an order number
// and event kind) instead of a new UUIDv7. It must follow idem's ID rules
// (idem.ValidateMessageID); Publish returns an error matching
// idem.ErrInvalidMessageID or idem.ErrMissingMessageID otherwise.
func WithMessageID(id string) PublishOption {
	return func(o *publishOptions) { o.id, o.idSet = id, true }
}

// WithFields adds fields to the entry. They cannot replace the ID and
// payload fields.
func WithFields(fields map[string]string) PublishOption {
	return func(o *publishOptions) { o.fields = fields }
}

// Publish appends an entry to stream (XADD, creating the stream if needed)
// with the message ID field and the payload field, and returns the message
// ID: a new UUIDv7 unless WithMessageID gave one. Publishing again with the
// same ID, after an error whose outcome is unknown, is what makes a retry
// safe: the consumer sees a duplicate.
//
// Errors: an invalid WithMessageID (idem.ErrInvalidMessageID,
// idem.ErrMissingMessageID), or the client's error.
func (p *Producer) Publish(ctx context.Context, stream string, payload []byte, opts ...PublishOption) (string, error) {
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
	args, err := p.xaddArgs(stream, id, payload, p.injectFields(ctx, o.fields))
	if err != nil {
		return "", err
	}
	return id, p.rdb.XAdd(ctx, args).Err()
}

// xaddArgs builds the XADD of Publish and of the relay's Publisher: the ID
// field, the payload field, then fields other than those two, trimmed to
// MaxLen when set. An id idem would reject returns an error matching
// idem.ErrInvalidMessageID or idem.ErrMissingMessageID.
func (p *Producer) xaddArgs(stream, id string, payload []byte, fields map[string]string) (*redis.XAddArgs, error) {
	if err := idem.ValidateMessageID(id, 0); err != nil {
		return nil, err
	}
	values := make([]any, 0, 4+2*len(fields))
	values = append(values, p.cfg.IDField, id, p.cfg.PayloadField, payload)
	for k, v := range fields {
		if k != p.cfg.IDField && k != p.cfg.PayloadField {
			values = append(values, k, v)
		}
	}
	args := &redis.XAddArgs{Stream: stream, Values: values}
	if p.cfg.MaxLen > 0 {
		args.MaxLen, args.Approx = p.cfg.MaxLen, true
	}
	return args, nil
}

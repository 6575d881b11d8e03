package idemkafka

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
)

// ProducerConfig configures a Producer. Zero values take the documented
// defaults.
type ProducerConfig struct {
	// IDHeader is the record header that carries the message ID; it must
	// match the consumers' Config.IDHeader. Defaults to DefaultIDHeader
	// ("message-id").
	IDHeader string
	// MaxIDLength is the longest message ID Publish accepts, in bytes, as
	// in idem.Config.MaxIDLength. Defaults to idem.DefaultMaxIDLength (255).
	MaxIDLength int
	// InjectHeaders, when set, is called on every Publish to add headers
	// from the publishing context (idemotel.InjectTraceContext writes the
	// W3C trace context, so the consumer's process span continues the
	// producer's trace). It cannot replace the message ID header.
	InjectHeaders idem.HeaderInjector
}

// Producer publishes records that carry a stable message ID in a header, so
// that an Idempotent Consumer recognises every copy of one message (a
// producer retry, a replay after a rebalance) as the same message.
type Producer struct {
	cl  *kgo.Client
	cfg ProducerConfig
}

// NewProducer returns a Producer that publishes with cl, the caller's
// client (any client can produce, a consumer group client included). The
// client stays the caller's to close. A nil client or a negative
// MaxIDLength makes every Publish fail with an error matching
// idem.ErrInvalidConfig.
func NewProducer(cl *kgo.Client, cfg ProducerConfig) *Producer {
	if cfg.IDHeader == "" {
		cfg.IDHeader = DefaultIDHeader
	}
	return &Producer{cl: cl, cfg: cfg}
}

// PublishOption sets an optional part of one Publish call.
type PublishOption func(*publishOptions)

type publishOptions struct {
	id      string
	idSet   bool
	key     []byte
	headers []kgo.RecordHeader
}

// WithMessageID publishes with id as the message ID instead of a new
// UUIDv7: a business key ("invoice-42/created") makes a producer that
// resends after a crash publish the same message again, which consumers
// then deduplicate.
func WithMessageID(id string) PublishOption {
	return func(o *publishOptions) { o.id, o.idSet = id, true }
}

// WithKey sets the record key, which picks the partition under the
// client's partitioner: records with one key stay in order. Without it the
// record has no key.
func WithKey(key []byte) PublishOption {
	return func(o *publishOptions) { o.key = key }
}

// WithHeaders adds headers to the record, after the message ID header. A
// header named like the message ID header (ProducerConfig.IDHeader), as in
// headers forwarded from a consumed record, is left out: the record carries
// exactly one message ID, the one Publish returns.
func WithHeaders(headers ...kgo.RecordHeader) PublishOption {
	return func(o *publishOptions) { o.headers = append(o.headers, headers...) }
}

// Publish produces payload to topic with a message ID header and waits
// until the broker acknowledged it (ProduceSync, with the client's acks
// setting: all in-sync replicas by default). It returns the message ID:
// the one given by WithMessageID, else a new UUIDv7 (time-ordered, so IDs
// sort by creation). The error matches idem.ErrInvalidConfig for a Producer
// built with a nil client or a negative MaxIDLength. An ID that breaks idem's rules is refused before
// anything is sent, with an error matching idem.ErrInvalidMessageID (or
// idem.ErrMissingMessageID for WithMessageID("")). Produce errors are
// returned as kgo gives them; the message may then have been written, and
// publishing again with the same ID is safe.
func (p *Producer) Publish(ctx context.Context, topic string, payload []byte, opts ...PublishOption) (string, error) {
	if err := p.check(); err != nil {
		return "", err
	}
	o := publishOptions{}
	for _, opt := range opts {
		opt(&o)
	}
	if !o.idSet {
		id, err := uuid.NewV7()
		if err != nil {
			return "", fmt.Errorf("idemkafka: new UUIDv7: %w", err)
		}
		o.id = id.String()
	}
	rec, err := p.record(topic, o.id, o.key, payload, o.headers)
	if err != nil {
		return "", err
	}
	p.injectHeaders(ctx, rec)
	if err := p.cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		return "", fmt.Errorf("idemkafka: publish to %q: %w", topic, err)
	}
	return o.id, nil
}

// check returns the error, matching idem.ErrInvalidConfig, of a Producer
// built with a nil client or a negative MaxIDLength.
func (p *Producer) check() error {
	switch {
	case p.cl == nil:
		return invalid("Producer has a nil *kgo.Client")
	case p.cfg.MaxIDLength < 0:
		return invalid(fmt.Sprintf("ProducerConfig.MaxIDLength %d is negative", p.cfg.MaxIDLength))
	}
	return nil
}

// record builds the record of Publish and of the relay's Publisher: id in
// the IDHeader first, then headers other than the IDHeader. An id idem
// would reject returns an error matching idem.ErrInvalidMessageID or
// idem.ErrMissingMessageID.
func (p *Producer) record(topic, id string, key, payload []byte, extra []kgo.RecordHeader) (*kgo.Record, error) {
	if err := idem.ValidateMessageID(id, p.cfg.MaxIDLength); err != nil {
		return nil, err
	}
	headers := make([]kgo.RecordHeader, 0, 1+len(extra))
	headers = append(headers, kgo.RecordHeader{Key: p.cfg.IDHeader, Value: []byte(id)})
	for _, h := range extra {
		if h.Key != p.cfg.IDHeader { // one ID header only: a second would make the ID ambiguous
			headers = append(headers, h)
		}
	}
	rec := &kgo.Record{Topic: topic, Key: key, Value: payload, Headers: headers}
	return rec, nil
}

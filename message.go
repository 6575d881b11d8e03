package idem

import "github.com/idem-go/idem/idemdriver"

// DefaultMaxIDLength is the longest message ID accepted by default, in bytes.
const DefaultMaxIDLength = idemdriver.DefaultMaxIDLength

// MaxConsumerNameLength is the longest consumer name accepted, in bytes.
const MaxConsumerNameLength = idemdriver.MaxConsumerNameLength

// Message is one delivery of a message: the producer's message ID and the
// payload whose fingerprint guards against an ID reused for other content.
//
// The ID is compared byte for byte on every store: no trimming, no case
// folding, no Unicode normalisation, no collation.
type Message struct {
	// ID is the producer-assigned message ID, 1 to MaxIDLength bytes of
	// UTF-8 without control characters.
	ID string
	// Payload is the message body. It is fingerprinted, not stored.
	Payload []byte
	// Headers are the delivery's broker metadata as the adapter read it
	// (NATS and Kafka headers, AMQP header table, Redis Streams fields
	// other than the payload), by name, values in the broker's order;
	// nil when there are none. They are neither fingerprinted nor stored:
	// they are there for a Processor that passes them on, such as
	// `idem consume`, which forwards them as HTTP headers.
	Headers Headers
}

// ValidateMessageID checks id against idem's message ID rules with the given
// maximum length in bytes (DefaultMaxIDLength when max <= 0).
//
// The rules, identical on every store: 1 to max bytes; valid UTF-8; no C0
// control characters (U+0000 to U+001F, NUL included), no DEL (U+007F) and
// no C1 controls (U+0080 to U+009F). An empty ID returns an error matching
// [ErrMissingMessageID]; every other violation matches [ErrInvalidMessageID].
//
// UTF-8 is required so that IDs store as text on PostgreSQL (whose text
// type rejects invalid UTF-8) and print in `idem inspect`; a producer with
// binary IDs should hex- or base64-encode them. Producers can call it
// before they publish; every store calls it again on its own entry points.
func ValidateMessageID(id string, max int) error { return idemdriver.ValidateMessageID(id, max) }

// ValidateConsumerName checks a consumer name: the message ID rules, with a
// maximum of MaxConsumerNameLength bytes. Errors match
// [ErrInvalidConsumerName].
func ValidateConsumerName(name string) error { return idemdriver.ValidateConsumerName(name) }

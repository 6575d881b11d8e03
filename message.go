package idem

import (
	"fmt"
	"unicode/utf8"
)

// DefaultMaxIDLength is the longest message ID accepted by default, in bytes.
const DefaultMaxIDLength = 255

// MaxConsumerNameLength is the longest consumer name accepted, in bytes.
const MaxConsumerNameLength = 255

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
}

// ValidateMessageID checks id against idem's message ID rules with the given
// maximum length in bytes (DefaultMaxIDLength when max <= 0).
//
// The rules, identical on every store: 1 to max bytes; valid UTF-8; no C0
// control characters (U+0000 to U+001F, NUL included), no DEL (U+007F) and
// no C1 controls (U+0080 to U+009F). An empty ID returns an error matching
// [ErrMissingMessageID]; every other violation matches [ErrInvalidMessageID].
//
// UTF-8 is required, which DESIGN.md leaves open, so that IDs store as text
// on PostgreSQL (whose text type rejects invalid UTF-8) and print in
// `idem inspect`; a producer with binary IDs should hex- or base64-encode them.
func ValidateMessageID(id string, max int) error {
	if max <= 0 {
		max = DefaultMaxIDLength
	}
	if id == "" {
		return ErrMissingMessageID
	}
	if reason := checkText(id, max); reason != "" {
		return fmt.Errorf("%w: %s", ErrInvalidMessageID, reason)
	}
	return nil
}

// ValidateConsumerName checks a consumer name: the same rules as a message ID,
// 1 to MaxConsumerNameLength bytes. Errors match [ErrInvalidConsumerName].
func ValidateConsumerName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty (a consumer name is mandatory)", ErrInvalidConsumerName)
	}
	if reason := checkText(name, MaxConsumerNameLength); reason != "" {
		return fmt.Errorf("%w: %s", ErrInvalidConsumerName, reason)
	}
	return nil
}

// checkText returns why s breaks the ID rules, or "".
func checkText(s string, max int) string {
	if len(s) > max {
		return fmt.Sprintf("%d bytes, over the maximum of %d", len(s), max)
	}
	for i, r := range s {
		switch {
		case r == utf8.RuneError && !validRuneAt(s, i):
			return fmt.Sprintf("invalid UTF-8 at byte %d", i)
		case r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f):
			return fmt.Sprintf("control character %U at byte %d", r, i)
		}
	}
	return ""
}

// validRuneAt reports whether s holds a real U+FFFD at i, not an invalid byte.
func validRuneAt(s string, i int) bool {
	_, size := utf8.DecodeRuneInString(s[i:])
	return size == 3
}

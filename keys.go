package idem

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
)

// DeriveKey returns the idempotency key for one external call made while
// processing a message: a call made before a crash still happened, so the
// redelivery must make the same call with the same key and let the third
// party deduplicate it (Stripe's Idempotency-Key, an email provider's
// dedupe ID).
//
// The key is "idem-" followed by the 64 hex digits of the SHA-256 of the
// length-prefixed consumer name, message ID and step name: 69 ASCII bytes,
// stable across redeliveries, processes and versions of idem, distinct for
// every (consumer, message ID, step) triple, and revealing none of them. It
// fits Stripe's 255-character limit and the IETF Idempotency-Key header.
// step names the call within the handler ("charge", "receipt-email"), so
// one message can make several external calls, each deduplicated apart.
func DeriveKey(consumer, messageID, step string) string {
	h := sha256.New()
	var n [8]byte
	for _, part := range []string{consumer, messageID, step} {
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write([]byte(part))
	}
	return "idem-" + hex.EncodeToString(h.Sum(nil))
}

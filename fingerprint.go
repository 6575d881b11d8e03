package idem

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/idem-go/idem/idemdriver"
)

// MaxFingerprintLength is the longest fingerprint a store keeps, in bytes.
const MaxFingerprintLength = idemdriver.MaxFingerprintLength

// Fingerprinter computes the fingerprint of a payload: at most
// MaxFingerprintLength bytes, equal for payloads that mean the same thing
// and different otherwise. An error must wrap [ErrInvalidPayload].
type Fingerprinter func(payload []byte) ([]byte, error)

// SHA256Fingerprint is the default Fingerprinter: the 32-byte SHA-256 of the
// payload's raw bytes. Two payloads that differ in any byte, whitespace and
// JSON key order included, have different fingerprints.
func SHA256Fingerprint(payload []byte) ([]byte, error) {
	sum := sha256.Sum256(payload)
	return sum[:], nil
}

// JSONFingerprint is the opt-in Fingerprinter for JSON payloads: the SHA-256
// of a canonical form, so a producer that re-serialises the same object with
// its keys in another order does not trip a false mismatch.
//
// The canonical form, close to RFC 8785 (JCS) but exact for numbers:
//   - object keys sorted by their UTF-8 bytes, at every depth; array order kept;
//   - no insignificant whitespace; a trailing newline is insignificant;
//   - strings compared by their decoded value (`\u00e9` equals `é`), then
//     written with one escaping rule; Unicode normalisation is not applied,
//     so NFC and NFD spellings stay different;
//   - numbers compared by exact decimal value (`1`, `1.0`, `1e0` and `10e-1`
//     are equal; `-0` equals `0`), with no float64 rounding, so integers
//     above 2^53 never collide.
//
// The payload must be one valid UTF-8 JSON value with no duplicate object
// keys (whose meaning differs between parsers), nested at most 10000 levels
// deep; anything else returns an error wrapping [ErrInvalidPayload].
func JSONFingerprint(payload []byte) ([]byte, error) {
	canon, err := CanonicalJSON(payload)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(canon)
	return sum[:], nil
}

// CanonicalJSON returns the canonical form JSONFingerprint hashes. Errors
// wrap [ErrInvalidPayload].
func CanonicalJSON(payload []byte) ([]byte, error) {
	if !utf8.Valid(payload) {
		return nil, fmt.Errorf("%w: JSON payload is not valid UTF-8", ErrInvalidPayload)
	}
	if i := loneSurrogate(payload); i >= 0 {
		// encoding/json would decode it to U+FFFD, so "\ud800" and
		// "\ufffd" would share a fingerprint.
		return nil, fmt.Errorf("%w: unpaired UTF-16 surrogate escape at byte %d", ErrInvalidPayload, i)
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var out bytes.Buffer
	if err := canonValue(dec, &out, 0); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidPayload, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: trailing data after the JSON value", ErrInvalidPayload)
	}
	return out.Bytes(), nil
}

// maxJSONDepth bounds the nesting of arrays and objects, as encoding/json's
// own decoder does: the canonicaliser recurses once per level, and a hostile
// payload of a few megabytes of "[" must not exhaust the goroutine stack.
const maxJSONDepth = 10000

// maxJSONExponent bounds the exponent of a canonical number, so exponent
// arithmetic cannot overflow and every canonical form parses again.
const maxJSONExponent = math.MaxInt64 / 4

func canonValue(dec *json.Decoder, out *bytes.Buffer, depth int) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch v := tok.(type) {
	case json.Delim:
		if depth >= maxJSONDepth {
			return fmt.Errorf("nesting deeper than %d levels", maxJSONDepth)
		}
		switch v {
		case '{':
			return canonObject(dec, out, depth+1)
		case '[':
			out.WriteByte('[')
			for i := 0; dec.More(); i++ {
				if i > 0 {
					out.WriteByte(',')
				}
				if err := canonValue(dec, out, depth+1); err != nil {
					return err
				}
			}
			if _, err := dec.Token(); err != nil {
				return err
			}
			out.WriteByte(']')
			return nil
		}
		return fmt.Errorf("unexpected %q", v)
	case string:
		writeJSONString(out, v)
	case json.Number:
		n, err := canonNumber(string(v))
		if err != nil {
			return err
		}
		out.WriteString(n)
	case bool:
		out.WriteString(strconv.FormatBool(v))
	case nil:
		out.WriteString("null")
	}
	return nil
}

func canonObject(dec *json.Decoder, out *bytes.Buffer, depth int) error {
	type member struct {
		key string
		val []byte
	}
	var members []member
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		key := tok.(string) // the decoder only yields string keys here
		if seen[key] {
			return fmt.Errorf("duplicate object key %q", key)
		}
		seen[key] = true
		var val bytes.Buffer
		if err := canonValue(dec, &val, depth); err != nil {
			return err
		}
		members = append(members, member{key, val.Bytes()})
	}
	if _, err := dec.Token(); err != nil {
		return err
	}
	sort.Slice(members, func(i, j int) bool { return members[i].key < members[j].key })
	out.WriteByte('{')
	for i, m := range members {
		if i > 0 {
			out.WriteByte(',')
		}
		writeJSONString(out, m.key)
		out.WriteByte(':')
		out.Write(m.val)
	}
	out.WriteByte('}')
	return nil
}

// writeJSONString writes s with one fixed escaping rule: `"` and `\` escaped,
// control characters as \u00XX, everything else as its UTF-8 bytes.
func writeJSONString(out *bytes.Buffer, s string) {
	out.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			out.WriteByte('\\')
			out.WriteRune(r)
		case r < 0x20:
			fmt.Fprintf(out, `\u%04x`, r)
		default:
			out.WriteRune(r)
		}
	}
	out.WriteByte('"')
}

// canonNumber writes a JSON number as its exact decimal value in the form
// [-]DDD[eN]: an integer significand with no leading or trailing zeros and
// a decimal exponent ("0" for zero, whatever its sign or exponent).
func canonNumber(s string) (string, error) {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	mant, expText := s, ""
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		mant, expText = s[:i], s[i+1:]
	}
	intPart, frac, _ := strings.Cut(mant, ".")
	digits := strings.TrimLeft(intPart+frac, "0")
	if digits == "" {
		return "0", nil
	}
	exp := int64(0)
	if expText != "" {
		e, err := strconv.ParseInt(expText, 10, 64)
		if err != nil || e > maxJSONExponent || e < -maxJSONExponent {
			return "", fmt.Errorf("number %q: exponent out of range", s)
		}
		exp = e
	}
	exp -= int64(len(frac))
	trimmed := strings.TrimRight(digits, "0")
	exp += int64(len(digits) - len(trimmed))
	if exp > maxJSONExponent || exp < -maxJSONExponent {
		return "", fmt.Errorf("number %q: exponent out of range", s)
	}
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	b.WriteString(trimmed)
	if exp != 0 {
		b.WriteByte('e')
		b.WriteString(strconv.FormatInt(exp, 10))
	}
	return b.String(), nil
}

// loneSurrogate returns the offset of the first \u escape inside a JSON
// string that is a UTF-16 surrogate without its pair, or -1.
func loneSurrogate(b []byte) int {
	inString := false
	pendingHigh := -1 // offset of a high surrogate waiting for its low half
	for i := 0; i < len(b); i++ {
		c := b[i]
		if !inString {
			if c == '"' {
				inString = true
			}
			continue
		}
		switch {
		case c == '"':
			if pendingHigh >= 0 {
				return pendingHigh
			}
			inString = false
		case c == '\\' && i+1 < len(b) && b[i+1] == 'u' && i+5 < len(b):
			v, err := strconv.ParseUint(string(b[i+2:i+6]), 16, 16)
			if err != nil {
				return -1 // malformed: the decoder reports it
			}
			switch {
			case v >= 0xD800 && v <= 0xDBFF:
				if pendingHigh >= 0 {
					return pendingHigh
				}
				pendingHigh = i
			case v >= 0xDC00 && v <= 0xDFFF:
				if pendingHigh < 0 {
					return i
				}
				pendingHigh = -1
			default:
				if pendingHigh >= 0 {
					return pendingHigh
				}
			}
			i += 5
		case c == '\\':
			if pendingHigh >= 0 {
				return pendingHigh
			}
			i++ // skip the escaped character
		default:
			if pendingHigh >= 0 {
				return pendingHigh
			}
		}
	}
	return pendingHigh
}

package idem

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxFingerprintLength is the longest fingerprint a store keeps, in bytes.
const MaxFingerprintLength = 64

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
// its keys in another order does not trip a false mismatch (field case C11).
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
// keys (whose meaning differs between parsers); anything else returns an
// error wrapping [ErrInvalidPayload].
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
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var out bytes.Buffer
	if err := canonValue(dec, &out); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidPayload, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: trailing data after the JSON value", ErrInvalidPayload)
	}
	return out.Bytes(), nil
}

func canonValue(dec *json.Decoder, out *bytes.Buffer) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch v := tok.(type) {
	case json.Delim:
		switch v {
		case '{':
			return canonObject(dec, out)
		case '[':
			out.WriteByte('[')
			for i := 0; dec.More(); i++ {
				if i > 0 {
					out.WriteByte(',')
				}
				if err := canonValue(dec, out); err != nil {
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

func canonObject(dec *json.Decoder, out *bytes.Buffer) error {
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
		if err := canonValue(dec, &val); err != nil {
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
// [-]D[.DDD]eN with no trailing zeros in the digits ("0" for zero).
func canonNumber(s string) (string, error) {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	mant, exp := s, int64(0)
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		e, err := strconv.ParseInt(s[i+1:], 10, 32)
		if err != nil {
			return "", fmt.Errorf("number %q: exponent out of range", s)
		}
		mant, exp = s[:i], e
	}
	intPart, frac, _ := strings.Cut(mant, ".")
	digits := intPart + frac
	exp -= int64(len(frac))
	digits = strings.TrimLeft(digits, "0")
	if digits == "" {
		return "0", nil
	}
	trimmed := strings.TrimRight(digits, "0")
	exp += int64(len(digits) - len(trimmed))
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

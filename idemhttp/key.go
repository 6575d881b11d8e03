package idemhttp

import (
	"fmt"
	"strings"
)

// HeaderIdempotencyKey is the request header carrying the key
// (draft-ietf-httpapi-idempotency-key-header). Header names are
// case-insensitive; net/http canonicalises HTTP/2's lowercase form.
const HeaderIdempotencyKey = "Idempotency-Key"

// HeaderReplayed is set to "true" on every replayed response.
const HeaderReplayed = "Idempotent-Replayed"

// KeyError describes why an Idempotency-Key header was refused. It matches
// ErrKeyMissing (no header) or ErrKeyInvalid (everything else).
type KeyError struct {
	// Reason says what is wrong, e.g. "empty key".
	Reason string
	// Missing is true when there was no header at all.
	Missing bool
}

// Error implements error.
func (e *KeyError) Error() string { return "idemhttp: Idempotency-Key: " + e.Reason }

// Is matches ErrKeyMissing or ErrKeyInvalid.
func (e *KeyError) Is(target error) bool {
	if e.Missing {
		return target == ErrKeyMissing
	}
	return target == ErrKeyInvalid
}

func keyInvalid(format string, args ...any) error {
	return &KeyError{Reason: fmt.Sprintf(format, args...)}
}

// ParseKey decodes the Idempotency-Key field lines of a request (pass
// r.Header.Values(HeaderIdempotencyKey)) into the key, 1 to maxLen bytes
// (DefaultMaxKeyLength when maxLen <= 0 or above it).
//
// The value is an RFC 9651 sf-string ("..." with \" and \\ escapes,
// printable ASCII), optionally followed by parameters, which are checked
// and ignored ("abc";v=1 is the key abc). Surrounding spaces and tabs are
// ignored. In lenient mode (strict false, the default of the middleware) a
// value that does not start with '"' is also accepted as it is when it is
// printable ASCII without '"' and ',' (a bare token such as abc-123, or a
// UUID). The key is case-sensitive and compared byte for byte.
//
// Errors (*KeyError): no field line matches ErrKeyMissing; more than one
// field line, a list ("a", "b"), an empty or blank key ("" or " "), a
// whitespace-only header, bad escapes or characters, trailing garbage, a bare value in
// strict mode, or a key longer than maxLen match ErrKeyInvalid.
func ParseKey(values []string, strict bool, maxLen int) (string, error) {
	if maxLen <= 0 || maxLen > DefaultMaxKeyLength {
		maxLen = DefaultMaxKeyLength
	}
	switch len(values) {
	case 0:
		return "", &KeyError{Reason: "header missing", Missing: true}
	case 1:
	default:
		return "", keyInvalid("%d field lines; send exactly one", len(values))
	}
	v := strings.Trim(values[0], " \t")
	if v == "" {
		return "", keyInvalid("empty key")
	}
	var key string
	if v[0] == '"' {
		k, rest, err := parseSFString(v)
		if err != nil {
			return "", err
		}
		if err := parseParams(rest); err != nil {
			return "", err
		}
		key = k
	} else {
		if strict {
			return "", keyInvalid("not an sf-string (strict mode: send the key in double quotes)")
		}
		for i := 0; i < len(v); i++ {
			c := v[i]
			if c < 0x20 || c > 0x7e || c == '"' || c == ',' {
				return "", keyInvalid("byte 0x%02x at %d not allowed in a bare key", c, i)
			}
		}
		key = v
	}
	if strings.Trim(key, " ") == "" {
		return "", keyInvalid("empty key")
	}
	if len(key) > maxLen {
		return "", keyInvalid("key of %d bytes; at most %d", len(key), maxLen)
	}
	return key, nil
}

// parseSFString parses the sf-string at the start of s (s[0] == '"') and
// returns its value and the rest of s.
func parseSFString(s string) (string, string, error) {
	// Most keys have no escapes: the string is a slice of s, with no
	// copy; the builder serves the others.
	for i := 1; i < len(s); i++ {
		c := s[i]
		if c == '"' {
			return s[1:i], s[i+1:], nil
		}
		if c == '\\' || c < 0x20 || c > 0x7e {
			break
		}
	}
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\':
			i++
			if i >= len(s) || (s[i] != '"' && s[i] != '\\') {
				return "", "", keyInvalid("bad escape in sf-string")
			}
			b.WriteByte(s[i])
		case c == '"':
			return b.String(), s[i+1:], nil
		case c < 0x20 || c > 0x7e:
			return "", "", keyInvalid("byte 0x%02x at %d not allowed in an sf-string", c, i)
		default:
			b.WriteByte(c)
		}
	}
	return "", "", keyInvalid("unterminated sf-string")
}

// parseParams checks RFC 9651 parameters (*( ";" *SP key [ "=" bare-item ] ))
// filling all of s.
func parseParams(s string) error {
	for s != "" {
		if s[0] != ';' {
			if s[0] == ',' {
				return keyInvalid("a list, not a single key")
			}
			return keyInvalid("unexpected %q after the key", s[0])
		}
		s = strings.TrimLeft(s[1:], " ")
		// key = ( lcalpha / "*" ) *( lcalpha / DIGIT / "_" / "-" / "." / "*" )
		if s == "" || !(isLCAlpha(s[0]) || s[0] == '*') {
			return keyInvalid("bad parameter name")
		}
		i := 1
		for i < len(s) && (isLCAlpha(s[i]) || isDigit(s[i]) || strings.IndexByte("_-.*", s[i]) >= 0) {
			i++
		}
		s = s[i:]
		if s != "" && s[0] == '=' {
			rest, err := skipBareItem(s[1:])
			if err != nil {
				return err
			}
			s = rest
		}
	}
	return nil
}

// skipBareItem skips one RFC 9651 bare item (integer, decimal, string,
// token, byte sequence, boolean, date or display string) at the start of s.
func skipBareItem(s string) (string, error) {
	if s == "" {
		return "", keyInvalid("missing parameter value")
	}
	switch c := s[0]; {
	case c == '"':
		_, rest, err := parseSFString(s)
		return rest, err
	case c == '-' || isDigit(c):
		j := 1
		for j < len(s) && (isDigit(s[j]) || s[j] == '.') {
			j++
		}
		if err := checkNumber(s[:j]); err != nil {
			return "", err
		}
		return s[j:], nil
	case c == '@':
		j := 1
		if j < len(s) && s[j] == '-' {
			j++
		}
		k := j
		for k < len(s) && isDigit(s[k]) {
			k++
		}
		if k == j || k-j > 15 {
			return "", keyInvalid("bad date in parameter")
		}
		return s[k:], nil
	case c == ':':
		end := strings.IndexByte(s[1:], ':')
		if end < 0 {
			return "", keyInvalid("unterminated byte sequence")
		}
		for _, r := range s[1 : 1+end] {
			if !(r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '+' || r == '/' || r == '=') {
				return "", keyInvalid("bad byte sequence")
			}
		}
		return s[end+2:], nil
	case c == '?':
		if len(s) < 2 || (s[1] != '0' && s[1] != '1') {
			return "", keyInvalid("bad boolean")
		}
		return s[2:], nil
	case c == '%':
		if len(s) < 2 || s[1] != '"' {
			return "", keyInvalid("bad display string")
		}
		end := strings.IndexByte(s[2:], '"')
		if end < 0 {
			return "", keyInvalid("unterminated display string")
		}
		for i := 2; i < 2+end; i++ {
			if s[i] < 0x20 || s[i] > 0x7e {
				return "", keyInvalid("bad display string")
			}
		}
		return s[end+3:], nil
	case isAlpha(c) || c == '*':
		// token = ( ALPHA / "*" ) *( tchar / ":" / "/" )
		i := 1
		for i < len(s) && (isTChar(s[i]) || s[i] == ':' || s[i] == '/') {
			i++
		}
		return s[i:], nil
	}
	return "", keyInvalid("bad parameter value")
}

// checkNumber checks an sf-integer or sf-decimal: an optional '-', 1 to 15
// digits, or 1 to 12 digits, '.', 1 to 3 digits.
func checkNumber(n string) error {
	n = strings.TrimPrefix(n, "-")
	intPart, frac, dec := strings.Cut(n, ".")
	ok := intPart != "" && !strings.ContainsRune(intPart, '.')
	if !dec {
		ok = ok && len(intPart) <= 15
	} else {
		ok = ok && len(intPart) <= 12 && frac != "" && len(frac) <= 3 && !strings.ContainsRune(frac, '.')
	}
	if !ok {
		return keyInvalid("bad number in parameter")
	}
	return nil
}

func isLCAlpha(c byte) bool { return c >= 'a' && c <= 'z' }
func isAlpha(c byte) bool   { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
func isDigit(c byte) bool   { return c >= '0' && c <= '9' }

// isTChar reports an RFC 9110 tchar.
func isTChar(c byte) bool {
	return isAlpha(c) || isDigit(c) || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

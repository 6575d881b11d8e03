package idemhttp

import (
	"crypto/sha256"
	"encoding/binary"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/idem-go/idem"
)

// fingerprintVersion starts every fingerprint's hash input, so a future
// change of the rules gives different fingerprints instead of false
// matches.
const fingerprintVersion = "idemhttp.fingerprint.v1"

// Body hashing modes, part of the fingerprint input.
const (
	bodyRaw  = "raw"
	bodyJSON = "canonical-json"
)

// Fingerprint returns the 32-byte fingerprint the middleware computes for a
// request: the SHA-256 of its method, escaped path, query (parameters
// sorted by name, the values of one name in their order), media type
// (lowercased, parameters sorted, charset lowercased), the
// method-override headers X-HTTP-Method-Override, X-HTTP-Method and
// X-Method-Override when present, and the SHA-256 of the body read from
// body to its end. With canonicalJSON, a JSON body
// (application/json or a +json media type) that parses is hashed in its
// idem.CanonicalJSON form instead of byte for byte; body is then read
// into memory. r.Body is not read. Errors are body's read errors.
//
// Two requests have the same fingerprint exactly when these parts are
// equal, so a key reused for another method, path, query, media type or
// body is detected (scenarios C1 to C7).
func Fingerprint(r *http.Request, body io.Reader, canonicalJSON bool) ([]byte, error) {
	if canonicalJSON && isJSON(r.Header.Get("Content-Type")) {
		b, err := io.ReadAll(body)
		if err != nil {
			return nil, err
		}
		sum, mode := bodySum(b, true)
		return fingerprint(r, sum, mode), nil
	}
	h := sha256.New()
	if _, err := io.Copy(h, body); err != nil {
		return nil, err
	}
	return fingerprint(r, h.Sum(nil), bodyRaw), nil
}

// bodySum returns the body hash of an in-memory body and its mode.
func bodySum(b []byte, canonicalJSON bool) ([]byte, string) {
	if canonicalJSON {
		if c, err := idem.CanonicalJSON(b); err == nil {
			s := sha256.Sum256(c)
			return s[:], bodyJSON
		}
	}
	s := sha256.Sum256(b)
	return s[:], bodyRaw
}

// fingerprint hashes the request's parts with a body hash computed by
// the caller: the fields are laid out in one buffer (on the stack for
// common requests) and hashed at once.
func fingerprint(r *http.Request, bodyHash []byte, mode string) []byte {
	var arr [512]byte
	b := arr[:0]
	b = field(b, fingerprintVersion)
	b = field(b, r.Method)
	b = field(b, r.URL.EscapedPath())
	b = field(b, canonicalQuery(r.URL.RawQuery))
	b = appendMediaType(b, r.Header.Get("Content-Type"))
	b = field(b, mode)
	b = field(b, string(bodyHash))
	// A method-override header changes the operation a POST performs
	// (when a later layer honours it): part of the fingerprint when
	// present. Absent, nothing is added, so earlier fingerprints hold.
	for _, name := range methodOverrideHeaders {
		if vs, ok := r.Header[name]; ok {
			b = field(b, name)
			b = field(b, strings.Join(vs, "\n"))
		}
	}
	sum := sha256.Sum256(b)
	return sum[:]
}

// methodOverrideHeaders are the (canonical) names of the common
// method-override headers, included in the fingerprint when present.
var methodOverrideHeaders = []string{"X-Http-Method-Override", "X-Http-Method", "X-Method-Override"}

// field appends s length-prefixed, so that no two sequences of fields
// produce the same input.
func field(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// canonicalQuery returns the query with its parameters sorted by name (a
// stable sort: the values of one name keep their order, which may carry
// meaning), each name and value length-prefixed. A query that does not
// parse is kept raw, under a distinct prefix.
func canonicalQuery(raw string) string {
	if raw == "" {
		return ""
	}
	vals, err := url.ParseQuery(raw)
	if err != nil {
		return "raw\x00" + raw
	}
	names := make([]string, 0, len(vals))
	for k := range vals {
		names = append(names, k)
	}
	slices.Sort(names)
	var b strings.Builder
	b.WriteString("q\x00")
	var n [binary.MaxVarintLen64]byte
	put := func(s string) {
		b.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		b.WriteString(s)
	}
	for _, k := range names {
		for _, v := range vals[k] {
			put(k)
			put(v)
		}
	}
	return b.String()
}

// canonicalMediaType returns the media type of a Content-Type value,
// lowercased, with its parameters sorted (names lowercased by
// mime.ParseMediaType, the charset value lowercased). A value that does
// not parse is kept trimmed, under a distinct prefix.
// appendMediaType is field(b, canonicalMediaType(ct)), with no
// allocation for the common media type without parameters, already in
// lower case ("application/json"): canonicalMediaType gives "mt\x00"+ct
// for it, and that is written straight to b.
func appendMediaType(b []byte, ct string) []byte {
	ct = strings.TrimSpace(ct)
	slash := strings.IndexByte(ct, '/')
	if slash <= 0 || slash == len(ct)-1 {
		return field(b, canonicalMediaType(ct))
	}
	for i := 0; i < len(ct); i++ {
		if c := ct[i]; i != slash && (!isTChar(c) || ('A' <= c && c <= 'Z')) {
			return field(b, canonicalMediaType(ct))
		}
	}
	b = binary.AppendUvarint(b, uint64(len("mt\x00")+len(ct)))
	return append(append(b, "mt\x00"...), ct...)
}

func canonicalMediaType(ct string) string {
	ct = strings.TrimSpace(ct)
	if ct == "" {
		return ""
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil {
		return "raw\x00" + ct
	}
	names := make([]string, 0, len(params))
	for k := range params {
		names = append(names, k)
	}
	slices.Sort(names)
	var b strings.Builder
	b.WriteString("mt\x00")
	b.WriteString(mt)
	for _, k := range names {
		v := params[k]
		if k == "charset" {
			v = strings.ToLower(v)
		}
		b.WriteString("\x00" + k + "\x00" + v)
	}
	return b.String()
}

// isJSON reports whether a Content-Type is JSON: application/json or a
// +json suffix.
func isJSON(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

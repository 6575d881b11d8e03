package idemhttp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

// recordContentType tags the result bytes of every record this package
// completes; recordVersion is the first byte of the encoding. A record
// with another tag or version is not decoded (ProblemRecordCorrupt).
const (
	recordContentType = "application/vnd.idem.http-response; v=1"
	recordVersion     = 1
)

// Record kinds.
const (
	kindResponse      = 1 // the response, replayable
	kindNotReplayable = 2 // completed, body over the cap: size and digest only
)

// Decoding limits, far above what the encoder writes, so a corrupt record
// cannot make the decoder allocate without bound.
const (
	maxRecordHeaders = 1 << 12
	maxRecordValues  = 1 << 12
)

// storedResponse is what a completed key replays.
type storedResponse struct {
	created    time.Time
	status     int
	header     http.Header
	replayable bool
	body       []byte   // kindResponse
	size       int64    // kindNotReplayable: full body size in bytes
	digest     [32]byte // kindNotReplayable: SHA-256 of the full body
}

// errCorrupt is wrapped by every decoding error.
var errCorrupt = errors.New("corrupt record")

// encodeRecord encodes sr, version 1:
//
//	version byte (1), kind byte (1 response, 2 not replayable),
//	created (varint, Unix nanoseconds), status (uvarint),
//	header count (uvarint), per header in name order: name (uvarint
//	length + bytes), value count (uvarint), values (uvarint length +
//	bytes) in order; then for kind 1 the body (uvarint length + bytes),
//	for kind 2 the body size (uvarint) and its 32-byte SHA-256.
func encodeRecord(sr *storedResponse) []byte {
	n := 32 + len(sr.body)
	for k, vs := range sr.header {
		n += len(k) + 10
		for _, v := range vs {
			n += len(v) + 10
		}
	}
	b := make([]byte, 0, n)
	kind := byte(kindResponse)
	if !sr.replayable {
		kind = kindNotReplayable
	}
	b = append(b, recordVersion, kind)
	b = binary.AppendVarint(b, sr.created.UnixNano())
	b = binary.AppendUvarint(b, uint64(sr.status))
	names := make([]string, 0, len(sr.header))
	for k := range sr.header {
		names = append(names, k)
	}
	slices.Sort(names)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, k := range names {
		b = appendString(b, k)
		vs := sr.header[k]
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = appendString(b, v)
		}
	}
	if sr.replayable {
		b = appendString(b, string(sr.body))
	} else {
		b = binary.AppendUvarint(b, uint64(sr.size))
		b = append(b, sr.digest[:]...)
	}
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// decodeRecord decodes a record completed by this package. Errors wrap
// errCorrupt.
func decodeRecord(contentType string, b []byte) (*storedResponse, error) {
	if contentType != recordContentType {
		return nil, fmt.Errorf("%w: content type %q, want %q", errCorrupt, contentType, recordContentType)
	}
	d := decoder{b: b}
	if len(b) <= smallRecordBytes {
		// One string for every name and value of a small record, rather
		// than one each.
		d.all = string(b)
	}
	if v := d.byte(); v != recordVersion {
		return nil, fmt.Errorf("%w: version %d", errCorrupt, v)
	}
	kind := d.byte()
	if d.err == nil && kind != kindResponse && kind != kindNotReplayable {
		return nil, fmt.Errorf("%w: kind %d", errCorrupt, kind)
	}
	sr := &storedResponse{replayable: kind == kindResponse}
	sr.created = time.Unix(0, d.varint())
	status := d.uvarint()
	if d.err == nil && (status < 200 || status > 999) {
		return nil, fmt.Errorf("%w: status %d", errCorrupt, status)
	}
	sr.status = int(status)
	nh := d.count(maxRecordHeaders)
	sr.header = make(http.Header, nh)
	// The values of the headers share one backing array (of room for the
	// usual one value a header), rather than an allocation each.
	var vals []string
	prev := ""
	for i := 0; i < nh && d.err == nil; i++ {
		k := d.string()
		if d.err == nil && (k == "" || (i > 0 && k <= prev) || !validHeaderName(k)) {
			return nil, fmt.Errorf("%w: header name %q", errCorrupt, k)
		}
		prev = k
		nv := d.count(maxRecordValues)
		if cap(vals)-len(vals) < nv {
			vals = make([]string, 0, max(nv, nh-i))
		}
		vs := vals[len(vals) : len(vals) : len(vals)+nv]
		vals = vals[:len(vals)+nv]
		for j := 0; j < nv && d.err == nil; j++ {
			v := d.string()
			if strings.ContainsAny(v, "\r\n\x00") {
				return nil, fmt.Errorf("%w: header value", errCorrupt)
			}
			vs = append(vs, v)
		}
		sr.header[k] = vs
	}
	if sr.replayable {
		// The body is the record's own bytes, not a copy: nothing
		// writes to either.
		sr.body = d.bytes(d.uvarint())
	} else {
		sr.size = int64(d.uvarint())
		copy(sr.digest[:], d.bytes(32))
		if d.err == nil && sr.size < 0 {
			return nil, fmt.Errorf("%w: size", errCorrupt)
		}
	}
	if d.err != nil {
		return nil, d.err
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", errCorrupt, len(d.b))
	}
	return sr, nil
}

// validHeaderName reports whether k is a non-empty token.
func validHeaderName(k string) bool {
	for i := 0; i < len(k); i++ {
		if !isTChar(k[i]) {
			return false
		}
	}
	return k != ""
}

// smallRecordBytes is the size up to which decodeRecord makes one string
// of the whole record and takes the names and values from it.
const smallRecordBytes = 4 << 10

// decoder reads the encoding; the first error sticks.
type decoder struct {
	b   []byte
	all string // the whole encoding as a string, or "" (one string each)
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: truncated or bad %s", errCorrupt, what)
	}
	d.b = nil
}

func (d *decoder) byte() byte {
	if d.err != nil || len(d.b) < 1 {
		d.fail("byte")
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("uvarint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) count(limit int) int {
	n := d.uvarint()
	if d.err == nil && n > uint64(limit) {
		d.fail("count")
		return 0
	}
	return int(n)
}

func (d *decoder) bytes(n uint64) []byte {
	if d.err != nil || uint64(len(d.b)) < n {
		d.fail("length")
		return nil
	}
	s := d.b[:n]
	d.b = d.b[n:]
	return s
}

func (d *decoder) string() string {
	n := d.uvarint()
	bs := d.bytes(n)
	if d.all == "" || d.err != nil {
		return string(bs)
	}
	end := len(d.all) - len(d.b)
	return d.all[end-len(bs) : end]
}

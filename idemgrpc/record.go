package idemgrpc

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// recordContentType is the content type of a stored call result (see
// recStatus): a google.rpc.Status in protobuf binary form, where an error
// keeps its code, message and details and an OK result has code 0 and
// the response message, as a google.protobuf.Any, as its only detail;
// then the metadata the handler set.
const recordContentType = "application/vnd.idem.grpc-result+proto; v=1"

// fingerprintVersion starts every fingerprint's hash input, so a future
// change of the rules gives different fingerprints instead of false
// matches.
const fingerprintVersion = "idemgrpc.fingerprint.v1"

// ErrRecordCorrupt means a stored result could not be decoded: another
// content type, bytes that do not parse, or a response type that is not
// linked into this binary (the protobuf global registry does not know
// it). The call is answered INTERNAL and never run again.
var ErrRecordCorrupt = errors.New("idemgrpc: stored result cannot be decoded")

// Fingerprint returns the 32-byte fingerprint of a call: the SHA-256 of
// the full method name, the request's message type and its deterministic
// protobuf encoding (proto.MarshalOptions{Deterministic: true}: map
// entries sorted, unknown fields kept as received). Two calls have the
// same fingerprint exactly when these are equal, so a key reused for
// another method or another request is detected. Errors are the
// marshaller's.
func Fingerprint(fullMethod string, req proto.Message) ([]byte, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	for _, part := range []string{fingerprintVersion, fullMethod, string(req.ProtoReflect().Descriptor().FullName())} {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	h.Write(b)
	return h.Sum(nil), nil
}

// Fields of a stored result, a protobuf message: field 1 is the
// google.rpc.Status, fields 2 and 3 the header and trailer metadata
// entries the handler set (each a message of key, field 1, and value,
// field 2), in key order, values in their order.
const (
	recStatus  protowire.Number = 1
	recHeader  protowire.Number = 2
	recTrailer protowire.Number = 3
)

// record is a call's result as stored.
type record struct {
	resp            any // a proto.Message, when st is OK
	st              *status.Status
	header, trailer metadata.MD
}

// storedKey reports whether a metadata key set by the handler is stored:
// not gRPC's reserved keys, nor this package's own.
func storedKey(k string) bool {
	return !strings.HasPrefix(k, "grpc-") && !strings.HasPrefix(k, ":") && k != MetadataKey && k != MetadataReplayed
}

// encodeRecord returns the stored form of a call's result: r.st when it
// is an error, r.resp otherwise, and the metadata.
func encodeRecord(r record) ([]byte, error) {
	p := r.st.Proto()
	if r.st.Code() == codes.OK {
		m, ok := r.resp.(proto.Message)
		if !ok || m == nil {
			return nil, fmt.Errorf("idemgrpc: response %T is not a proto.Message", r.resp)
		}
		a, err := anypb.New(m)
		if err != nil {
			return nil, err
		}
		p = &spb.Status{Details: []*anypb.Any{a}}
	}
	sb, err := proto.MarshalOptions{Deterministic: true}.Marshal(p)
	if err != nil {
		return nil, err
	}
	b := protowire.AppendTag(nil, recStatus, protowire.BytesType)
	b = protowire.AppendBytes(b, sb)
	for _, f := range []struct {
		num protowire.Number
		md  metadata.MD
	}{{recHeader, r.header}, {recTrailer, r.trailer}} {
		for _, k := range slices.Sorted(maps.Keys(f.md)) {
			if !storedKey(k) {
				continue
			}
			for _, v := range f.md[k] {
				e := protowire.AppendTag(nil, 1, protowire.BytesType)
				e = protowire.AppendString(e, k)
				e = protowire.AppendTag(e, 2, protowire.BytesType)
				e = protowire.AppendString(e, v)
				b = protowire.AppendTag(b, f.num, protowire.BytesType)
				b = protowire.AppendBytes(b, e)
			}
		}
	}
	return b, nil
}

// decodeRecord returns the stored result. Errors match ErrRecordCorrupt.
func decodeRecord(contentType string, b []byte) (record, error) {
	var r record
	if contentType != recordContentType {
		return r, fmt.Errorf("%w: content type %q, want %q", ErrRecordCorrupt, contentType, recordContentType)
	}
	var sb []byte
	r.header, r.trailer = metadata.MD{}, metadata.MD{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType {
			return r, fmt.Errorf("%w: bad field", ErrRecordCorrupt)
		}
		v, m := protowire.ConsumeBytes(b[n:])
		if m < 0 {
			return r, fmt.Errorf("%w: bad field %d", ErrRecordCorrupt, num)
		}
		b = b[n+m:]
		switch num {
		case recStatus:
			sb = v
		case recHeader, recTrailer:
			k, val, err := decodeEntry(v)
			if err != nil {
				return r, err
			}
			md := r.header
			if num == recTrailer {
				md = r.trailer
			}
			md[k] = append(md[k], val)
		}
	}
	var p spb.Status
	if err := proto.Unmarshal(sb, &p); err != nil {
		return r, fmt.Errorf("%w: %w", ErrRecordCorrupt, err)
	}
	if p.Code != int32(codes.OK) {
		r.st = status.FromProto(&p)
		return r, nil
	}
	if len(p.Details) != 1 {
		return r, fmt.Errorf("%w: OK result with %d details, want the response", ErrRecordCorrupt, len(p.Details))
	}
	m, err := p.Details[0].UnmarshalNew()
	if err != nil {
		return r, fmt.Errorf("%w: response %s: %w", ErrRecordCorrupt, p.Details[0].GetTypeUrl(), err)
	}
	r.resp, r.st = m, status.New(codes.OK, "")
	return r, nil
}

// decodeEntry decodes one metadata entry: key (field 1), value (field 2).
func decodeEntry(b []byte) (k, v string, err error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType {
			return "", "", fmt.Errorf("%w: bad metadata entry", ErrRecordCorrupt)
		}
		s, m := protowire.ConsumeString(b[n:])
		if m < 0 {
			return "", "", fmt.Errorf("%w: bad metadata entry", ErrRecordCorrupt)
		}
		b = b[n+m:]
		if num == 1 {
			k = s
		} else {
			v = s
		}
	}
	return k, v, nil
}

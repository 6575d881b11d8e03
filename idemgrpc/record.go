package idemgrpc

import (
	"crypto/sha256"
	"errors"
	"fmt"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// recordContentType is the content type of a stored call result: a
// google.rpc.Status in protobuf binary form. An error keeps its code,
// message and details; an OK result has code 0 and the response message,
// as a google.protobuf.Any, as its only detail.
const recordContentType = "application/vnd.idem.grpc-status+proto; v=1"

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

// encodeRecord returns the stored form of a call's result: st when it is
// an error, resp otherwise.
func encodeRecord(st *status.Status, resp any) ([]byte, error) {
	p := st.Proto()
	if st.Code() == codes.OK {
		m, ok := resp.(proto.Message)
		if !ok {
			return nil, fmt.Errorf("idemgrpc: response %T is not a proto.Message", resp)
		}
		a, err := anypb.New(m)
		if err != nil {
			return nil, err
		}
		p = &spb.Status{Details: []*anypb.Any{a}}
	}
	return proto.MarshalOptions{Deterministic: true}.Marshal(p)
}

// decodeRecord returns the stored result: the response message when its
// status is OK, or the status error. Errors match ErrRecordCorrupt.
func decodeRecord(contentType string, b []byte) (proto.Message, *status.Status, error) {
	if contentType != recordContentType {
		return nil, nil, fmt.Errorf("%w: content type %q, want %q", ErrRecordCorrupt, contentType, recordContentType)
	}
	var p spb.Status
	if err := proto.Unmarshal(b, &p); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrRecordCorrupt, err)
	}
	if p.Code != int32(codes.OK) {
		return nil, status.FromProto(&p), nil
	}
	if len(p.Details) != 1 {
		return nil, nil, fmt.Errorf("%w: OK result with %d details, want the response", ErrRecordCorrupt, len(p.Details))
	}
	m, err := p.Details[0].UnmarshalNew()
	if err != nil {
		return nil, nil, fmt.Errorf("%w: response %s: %w", ErrRecordCorrupt, p.Details[0].GetTypeUrl(), err)
	}
	return m, status.New(codes.OK, ""), nil
}

package idemgrpc

import (
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of the interceptor's own
// answers; their Reason is one of the Reason* constants.
const ErrorDomain = "idemgrpc.idem-go.github.com"

// Reasons of the interceptor's own answers (google.rpc.ErrorInfo.Reason),
// one per condition, as the HTTP middleware has one problem type per
// condition. The code each comes with is in the package documentation.
const (
	// ReasonKeyMissing: INVALID_ARGUMENT, no key where Options.RequireKey.
	ReasonKeyMissing = "IDEMPOTENCY_KEY_MISSING"
	// ReasonKeyInvalid: INVALID_ARGUMENT, the key does not parse
	// (idemhttp.ParseKey), is too long, or is sent more than once.
	ReasonKeyInvalid = "IDEMPOTENCY_KEY_INVALID"
	// ReasonScopeMissing: UNAUTHENTICATED, Options.Scope found no principal.
	ReasonScopeMissing = "IDEMPOTENCY_SCOPE_MISSING"
	// ReasonInProgress: ABORTED with RetryInfo, another call with the key
	// holds its lease.
	ReasonInProgress = "REQUEST_IN_PROGRESS"
	// ReasonKeyReused: FAILED_PRECONDITION, the key was used with another
	// method or request message.
	ReasonKeyReused = "IDEMPOTENCY_KEY_REUSED"
	// ReasonUnavailable: UNAVAILABLE with RetryInfo, the store cannot be
	// reached and nothing ran (INTERNAL when the store refused the call).
	ReasonUnavailable = "IDEMPOTENCY_UNAVAILABLE"
	// ReasonRecordCorrupt: INTERNAL, the stored result cannot be decoded
	// or the record is failed; nothing ran.
	ReasonRecordCorrupt = "IDEMPOTENCY_RECORD_CORRUPT"
	// ReasonLeaseLost: ABORTED with RetryInfo, another attempt took the key
	// over while this one ran.
	ReasonLeaseLost = "IDEMPOTENCY_LEASE_LOST"
	// ReasonOutcomeUnknown: UNKNOWN, stored, an earlier attempt ran and
	// never recorded its result (idemhttp.AnswerUnknownAfterCrash).
	ReasonOutcomeUnknown = "REQUEST_OUTCOME_UNKNOWN"
	// ReasonNotRecorded: UNAVAILABLE, the call ran but its result could
	// not be recorded before the lease ended.
	ReasonNotRecorded = "RESPONSE_NOT_RECORDED"
	// ReasonNotProtoMessage: INTERNAL, the request is not a proto.Message
	// and cannot be fingerprinted.
	ReasonNotProtoMessage = "NOT_A_PROTO_MESSAGE"
)

// newStatus is an answer of the interceptor: code and message, an
// ErrorInfo with reason, and, when retryAfter is positive, a RetryInfo
// asking the client to wait that long before the retry.
func newStatus(c codes.Code, reason, msg string, retryAfter time.Duration) *status.Status {
	st := status.New(c, "idemgrpc: "+msg)
	ds, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain})
	if err != nil {
		return st
	}
	if retryAfter > 0 {
		if ds2, err := ds.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(retryAfter)}); err == nil {
			ds = ds2
		}
	}
	return ds
}

// Reason returns the ErrorInfo reason of err when it is an answer of the
// interceptor (its domain is ErrorDomain), or "".
func Reason(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetDomain() == ErrorDomain {
			return ei.GetReason()
		}
	}
	return ""
}

// RetryDelay returns the delay a RetryInfo detail of err asks for, and
// whether it has one.
func RetryDelay(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			return max(0, ri.GetRetryDelay().AsDuration()), true
		}
	}
	return 0, false
}

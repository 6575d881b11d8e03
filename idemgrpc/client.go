package idemgrpc

import (
	"context"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/internal/keyed"
)

// ClientOptions configures the client interceptor. The zero value is
// usable. The retry fields mean what the fields of idemhttp.TransportOptions
// of the same name mean, with the same defaults (idemhttp.DefaultClient*):
// a call is sent at most MaxAttempts times (5; 1 disables retries), no
// retry starts later than MaxElapsed (1 minute) after the first attempt,
// the wait before retry n is drawn uniformly from [0, min(MaxInterval,
// InitialInterval * Multiplier^(n-1))] (full jitter; 100ms, 2, 10s), and
// a server's RetryInfo delay replaces that wait, capped at MaxRetryAfter
// (30s). The call's context bounds everything.
type ClientOptions struct {
	// Methods reports whether calls to a method (its full name) get a key
	// and retries. Defaults to every method. A call whose outgoing
	// metadata already carries the key is retried whatever its method.
	Methods func(fullMethod string) bool
	// NewKey makes the key of a logical call that has none. Defaults to a
	// UUIDv7 (RFC 9562), sent bare (the server's default, lenient key
	// syntax accepts it).
	NewKey func() (string, error)

	// MaxAttempts is the most times a call is sent, the first included.
	MaxAttempts int
	// MaxElapsed bounds the time in which retries may start.
	MaxElapsed time.Duration
	// InitialInterval and MaxInterval bound the backoff ceiling.
	InitialInterval, MaxInterval time.Duration
	// Multiplier grows the backoff ceiling per retry.
	Multiplier float64
	// MaxRetryAfter caps a server's RetryInfo delay.
	MaxRetryAfter time.Duration

	// OnRetry, if set, is called before each wait for a retry with the
	// call's key, the attempt just made (1 for the first), its error and
	// the wait.
	OnRetry func(key string, attempt int, reason error, wait time.Duration)
}

type clientKeyCtx struct{}

// ContextWithKey returns a context that makes the client interceptor send
// key as the idempotency key of the calls made with it, instead of a
// generated one: use a business key (an order ID) or a key saved before a
// crash, so a call retried by a new process is still deduplicated. A key
// already in the outgoing metadata (metadata.AppendToOutgoingContext with
// MetadataKey) wins over it.
func ContextWithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, clientKeyCtx{}, key)
}

// RetryError is returned when the attempts of a logical call all failed
// with retryable errors and the retries ran out (MaxAttempts,
// MaxElapsed). Key is the idempotency key every attempt carried: a later
// retry by the caller with the same key is still deduplicated by the
// server. Err is the last attempt's error, so status.Code and
// status.FromError see its status (RetryError has GRPCStatus).
type RetryError struct {
	// Key is the idempotency key every attempt sent.
	Key string
	// Attempts is how many times the call was sent.
	Attempts int
	// Err is the last attempt's error.
	Err error
}

// Error implements error.
func (e *RetryError) Error() string {
	return fmt.Sprintf("idemgrpc: %d attempt(s) with idempotency key %q failed: %v", e.Attempts, e.Key, e.Err)
}

// Unwrap returns the last attempt's error.
func (e *RetryError) Unwrap() error { return e.Err }

// GRPCStatus returns the last attempt's status.
func (e *RetryError) GRPCStatus() *status.Status { return status.Convert(e.Err) }

// NewClientInterceptor returns a unary client interceptor that makes a
// call safe to retry and retries it: each logical call (one Invoke) gets
// one idempotency key, sent unchanged in the MetadataKey metadata on every
// attempt, so a server behind Server's interceptor runs it at most once
// however many attempts reach it.
//
// The key is, in order: the one already in the call's outgoing metadata;
// the one put in the context with ContextWithKey; or a new one from
// ClientOptions.NewKey.
//
// An attempt is retried when it fails with UNAVAILABLE (the transport's
// failures, a server shutting down, the store down: gRPC's guidance names
// it the code a client can retry as it is), ABORTED from this package's
// interceptor for a call in progress or a lease taken over, or
// RESOURCE_EXHAUSTED with a google.rpc.RetryInfo. Nothing else is retried:
// not FAILED_PRECONDITION (the key was reused with another request), not
// INVALID_ARGUMENT, not UNKNOWN outcome-unknown (stored: every retry gets
// it), not the application's own codes. Waits follow exponential backoff
// with full jitter (github.com/cenkalti/backoff/v5), or the status's
// RetryInfo delay, capped at MaxRetryAfter. Retries stop at MaxAttempts, at
// MaxElapsed or when the call's context is done; the last error is then
// returned, wrapped in a *RetryError when there was more than one attempt.
// Values out of range return an error matching idem.ErrInvalidConfig.
func NewClientInterceptor(opts *ClientOptions) (grpc.UnaryClientInterceptor, error) {
	var o ClientOptions
	if opts != nil {
		o = *opts
	}
	if o.Methods == nil {
		o.Methods = func(string) bool { return true }
	}
	if o.NewKey == nil {
		o.NewKey = func() (string, error) {
			u, err := uuid.NewV7()
			return u.String(), err
		}
	}
	for _, d := range []struct {
		p   *time.Duration
		def time.Duration
	}{
		{&o.MaxElapsed, idemhttp.DefaultClientMaxElapsed}, {&o.InitialInterval, idemhttp.DefaultClientInitialInterval},
		{&o.MaxInterval, idemhttp.DefaultClientMaxInterval}, {&o.MaxRetryAfter, idemhttp.DefaultClientMaxRetryAfter},
	} {
		if *d.p == 0 {
			*d.p = d.def
		}
	}
	if o.MaxAttempts == 0 {
		o.MaxAttempts = idemhttp.DefaultClientMaxAttempts
	}
	if o.Multiplier == 0 {
		o.Multiplier = idemhttp.DefaultClientMultiplier
	}
	switch {
	case o.MaxAttempts < 1:
		return nil, fmt.Errorf("%w: MaxAttempts %d, want >= 1", idem.ErrInvalidConfig, o.MaxAttempts)
	case o.MaxElapsed < 0, o.InitialInterval < 0, o.MaxInterval < 0, o.MaxRetryAfter < 0:
		return nil, fmt.Errorf("%w: negative duration in ClientOptions", idem.ErrInvalidConfig)
	case !(o.Multiplier >= 1 && o.Multiplier <= 100):
		return nil, fmt.Errorf("%w: Multiplier %v, want 1..100", idem.ErrInvalidConfig, o.Multiplier)
	case o.MaxInterval < o.InitialInterval:
		return nil, fmt.Errorf("%w: MaxInterval %v below InitialInterval %v", idem.ErrInvalidConfig, o.MaxInterval, o.InitialInterval)
	}
	return o.invoke, nil
}

// invoke is the client interceptor.
func (o ClientOptions) invoke(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
	md, _ := metadata.FromOutgoingContext(ctx)
	key := ""
	if vs := md.Get(MetadataKey); len(vs) > 0 {
		key = vs[0]
	} else {
		if !o.Methods(method) {
			return invoker(ctx, method, req, reply, cc, callOpts...)
		}
		if k, ok := ctx.Value(clientKeyCtx{}).(string); ok && k != "" {
			key = k
		} else {
			k, err := o.NewKey()
			if err != nil {
				return fmt.Errorf("idemgrpc: new idempotency key: %w", err)
			}
			key = k
		}
		ctx = metadata.AppendToOutgoingContext(ctx, MetadataKey, key)
	}
	attempts := 0
	op := func() (struct{}, error) {
		attempts++
		err := invoker(ctx, method, req, reply, cc, callOpts...)
		if err == nil || ctx.Err() != nil || !retryable(err) {
			return struct{}{}, backoff.Permanent(err)
		}
		if d, ok := RetryDelay(err); ok {
			return struct{}{}, &retryAfterError{RetryAfterError: backoff.RetryAfterError{Duration: min(d, o.MaxRetryAfter)}, err: err}
		}
		return struct{}{}, err
	}
	ropts := []backoff.RetryOption{
		backoff.WithBackOff(&keyed.FullJitter{Initial: o.InitialInterval, Multiplier: o.Multiplier, Max: o.MaxInterval}),
		backoff.WithMaxTries(uint(o.MaxAttempts)),
		backoff.WithMaxElapsedTime(o.MaxElapsed),
	}
	if o.OnRetry != nil {
		ropts = append(ropts, backoff.WithNotify(func(err error, wait time.Duration) {
			o.OnRetry(key, attempts, unwrapRetryAfter(err), wait)
		}))
	}
	_, err := backoff.Retry(ctx, op, ropts...)
	if err == nil {
		return nil
	}
	err = unwrapRetryAfter(err) // backoff.Retry unwraps a Permanent error itself
	if attempts == 1 {
		return err
	}
	return &RetryError{Key: key, Attempts: attempts, Err: err}
}

// retryable reports whether an attempt's error warrants a retry with the
// same key.
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable:
		return true
	case codes.Aborted:
		r := Reason(err)
		return r == ReasonInProgress || r == ReasonLeaseLost
	case codes.ResourceExhausted:
		_, ok := RetryDelay(err)
		return ok
	}
	return false
}

// retryAfterError is backoff's wait request that keeps the status it
// came with.
type retryAfterError struct {
	backoff.RetryAfterError
	err error
}

func (e *retryAfterError) Unwrap() error { return &e.RetryAfterError }

func unwrapRetryAfter(err error) error {
	// backoff.Retry returns the operation's last error as it is when the
	// tries run out, a Permanent wrapper included.
	if pe, ok := err.(*backoff.PermanentError); ok {
		err = pe.Unwrap()
	}
	if ra, ok := err.(*retryAfterError); ok {
		return ra.err
	}
	return err
}

package idemgrpc

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemhttp"
)

// MetadataKey is the request metadata entry carrying the idempotency key
// (the Idempotency-Key header of draft-ietf-httpapi-idempotency-key-header,
// in gRPC's lowercase metadata form). Answers on the idempotency path echo
// it in their header metadata.
const MetadataKey = "idempotency-key"

// MetadataReplayed is set to "true" in the header and trailer metadata of
// every replayed answer (the HTTP middleware's Idempotent-Replayed).
const MetadataReplayed = "idempotent-replayed"

// consumerPrefix starts the consumer name of every record of this package.
const consumerPrefix = "idemgrpc:"

// maxInlineKey is the longest key kept readable in a record ID: the scope
// hash (22 bytes) and a separator leave 232 of the store's 255 bytes.
const maxInlineKey = 255 - 23

// Recovery points of an attempt in at-most-once mode, named by the
// attempt's fencing token: runStep is saved before the handler runs,
// settledStep before a release whose outcome is known. An attempt that
// takes over a record with a runStep and no settledStep of the same token
// knows an earlier attempt may have acted.
const (
	runStepPrefix     = "idemgrpc:run:"
	settledStepPrefix = "idemgrpc:settled:"
)

// Server is the idempotency-key interceptor for gRPC unary calls over an
// idemdriver.LeaseStore (memory, PostgreSQL, MariaDB/MySQL, SQLite or
// Redis). See the package documentation for its semantics. It runs each
// keyed call as one attempt of an idem.LeaseConsumer (the core's lease
// engine: lease, renewal, recovery points, completion, release,
// retention, hooks) and adds the gRPC semantics: metadata, scope,
// fingerprint, stored statuses and replay. It is safe for concurrent use;
// Close stops its background loops.
type Server struct {
	lc       *idem.LeaseConsumer
	o        Options
	consumer string

	stats struct {
		passThrough, executed, replayed, inProgress, keyReused, released,
		completed, rejected, storeErrors, failOpen, leaseLost, panics, unknown atomic.Int64
	}
}

// Stats counts what a Server did since New. Every field is a count of
// calls.
type Stats struct {
	// PassThrough: methods not covered, or no key where none is required.
	PassThrough int64
	// Executed: the handler ran holding the key's lease (or, in
	// at-most-once mode, the attempt answered outcome-unknown; see Unknown).
	Executed int64
	// Replayed: a stored result was replayed.
	Replayed int64
	// InProgress: answered ABORTED request-in-progress.
	InProgress int64
	// KeyReused: answered FAILED_PRECONDITION idempotency-key-reused.
	KeyReused int64
	// Released: the handler ran and its key was released (a code that
	// ReleaseCode selects, a panic, a response that cannot be stored).
	Released int64
	// Completed: the handler ran and its result was recorded.
	Completed int64
	// Rejected: answered INVALID_ARGUMENT or UNAUTHENTICATED before the
	// key reached the store.
	Rejected int64
	// StoreErrors: store calls that failed.
	StoreErrors int64
	// FailOpen: handler runs without idempotency because the store was
	// unavailable (Options.FailOpen).
	FailOpen int64
	// LeaseLost: attempts whose lease was lost while the handler ran or
	// before its result was recorded.
	LeaseLost int64
	// Panics: handler panics.
	Panics int64
	// Unknown: attempts that took over a key whose earlier attempt ran
	// and never recorded its result, and stored outcome-unknown instead
	// of running the handler (idemhttp.AnswerUnknownAfterCrash).
	Unknown int64
}

// New returns a Server over store. Errors match ErrNoScope when
// opts.Scope is nil, and ErrInvalidOptions (and idem.ErrInvalidConfig)
// for any other invalid field, a nil store or an invalid hook. It starts
// the lease engine's background loops (marking the namespace running for
// retention, and, unless opts.PurgeInterval is negative, purging), which
// Close stops.
func New(store idemdriver.LeaseStore, opts Options) (*Server, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: nil store", ErrInvalidOptions)
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Server{o: o, consumer: consumerPrefix + o.Namespace}
	s.lc, err = idem.NewLeaseConsumer(store, idem.Config{
		Name:            s.consumer,
		Fingerprinter:   func(fp []byte) ([]byte, error) { return fp, nil }, // the payload is the call's fingerprint
		RetentionWindow: o.Retention,
		PurgeInterval:   o.PurgeInterval,
		PurgeBatchSize:  o.PurgeBatchSize,
		Logger:          o.Logger,
		Hooks:           o.Hooks,
		Lease:           o.Lease,
		// A key is retried for as long as its clients retry: a released
		// result never poisons it.
		MaxAttempts: math.MaxInt32,
		Retryable:   func(error) bool { return true },
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	return s, nil
}

// Close stops the background loops and waits for them. Keyed calls that
// arrive later get UNAVAILABLE (idem.ErrClosed); calls that pass through
// are still served. Idempotent; always returns nil.
func (s *Server) Close() error { return s.lc.Close() }

// Consumer returns the consumer name of this Server's records:
// "idemgrpc:" + Options.Namespace.
func (s *Server) Consumer() string { return s.consumer }

// Purge deletes this namespace's completed records that the namespace has
// outrun by Options.Retention of running time (idem.Purge). It returns an
// error matching idem.ErrPurgeInProgress when another cleaner holds the
// purge lock.
func (s *Server) Purge(ctx context.Context) (idem.PurgeResult, error) { return s.lc.Purge(ctx) }

// RecordID returns the store message ID of a scope and key, built as the
// HTTP middleware builds its own: the base64url (unpadded, 22 characters)
// of the first 16 bytes of the SHA-256 of scope, then ':' and the key
// when it fits in 232 bytes, or '!' and the hex SHA-256 of the key when
// it does not. The scope is never stored in clear.
func (s *Server) RecordID(scope, key string) string {
	sh := sha256.Sum256([]byte(scope))
	id := base64.RawURLEncoding.EncodeToString(sh[:16])
	if len(key) <= maxInlineKey {
		return id + ":" + key
	}
	kh := sha256.Sum256([]byte(key))
	return id + "!" + hex.EncodeToString(kh[:])
}

// Stats returns the counters.
func (s *Server) Stats() Stats {
	c := &s.stats
	return Stats{
		PassThrough: c.passThrough.Load(), Executed: c.executed.Load(), Replayed: c.replayed.Load(),
		InProgress: c.inProgress.Load(), KeyReused: c.keyReused.Load(), Released: c.released.Load(),
		Completed: c.completed.Load(), Rejected: c.rejected.Load(), StoreErrors: c.storeErrors.Load(),
		FailOpen: c.failOpen.Load(), LeaseLost: c.leaseLost.Load(), Panics: c.panics.Load(), Unknown: c.unknown.Load(),
	}
}

// UnaryServerInterceptor returns the interceptor; install it with
// grpc.ChainUnaryInterceptor after your authentication interceptor, so
// that Options.Scope sees the authenticated caller.
func (s *Server) UnaryServerInterceptor() grpc.UnaryServerInterceptor { return s.intercept }

// intercept is the idempotency path of one call.
func (s *Server) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if !s.o.Methods(info.FullMethod) {
		s.stats.passThrough.Add(1)
		return handler(ctx, req)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	values := md.Get(MetadataKey)
	if len(values) == 0 && !s.o.RequireKey {
		s.stats.passThrough.Add(1)
		return handler(ctx, req)
	}
	key, err := idemhttp.ParseKey(values, s.o.StrictKey, s.o.MaxKeyLength)
	if err != nil {
		s.stats.rejected.Add(1)
		var ke *idemhttp.KeyError
		reason, why := ReasonKeyInvalid, err.Error()
		if errors.As(err, &ke) {
			why = ke.Reason
		}
		if errors.Is(err, idemhttp.ErrKeyMissing) {
			reason, why = ReasonKeyMissing, "this method requires the "+MetadataKey+" metadata"
		}
		return nil, newStatus(codes.InvalidArgument, reason, MetadataKey+": "+why, 0).Err()
	}
	// Every answer on the idempotency path echoes the key, as Stripe does.
	_ = grpc.SetHeader(ctx, metadata.Pairs(MetadataKey, values[0]))
	scope, err := s.o.Scope(ctx)
	if err != nil || scope == "" {
		s.stats.rejected.Add(1)
		if _, ok := status.FromError(err); ok && err != nil {
			return nil, err
		}
		why := "the call has no principal to scope its idempotency key"
		if err != nil {
			why += ": " + err.Error()
		}
		return nil, newStatus(codes.Unauthenticated, ReasonScopeMissing, why, 0).Err()
	}
	msg, ok := req.(proto.Message)
	if !ok {
		return nil, newStatus(codes.Internal, ReasonNotProtoMessage, fmt.Sprintf("request %T is not a proto.Message: it cannot be fingerprinted", req), 0).Err()
	}
	fp, err := Fingerprint(info.FullMethod, msg)
	if err != nil {
		return nil, newStatus(codes.Internal, ReasonNotProtoMessage, "request cannot be fingerprinted: "+err.Error(), 0).Err()
	}
	a, out, err := s.lc.Acquire(ctx, idem.Message{ID: s.RecordID(scope, key), Payload: fp}, idem.AcquireOptions{Wait: s.o.Wait})
	if a == nil {
		return s.answerExisting(ctx, req, handler, out, err)
	}
	return s.run(req, handler, a)
}

// answerExisting answers a call whose key the lease engine did not
// acquire: a replay, an error status, or a store outage.
func (s *Server) answerExisting(ctx context.Context, req any, handler grpc.UnaryHandler, out idem.Outcome, err error) (any, error) {
	switch {
	case out.Status == idem.Duplicate:
		return s.replay(ctx, out)
	case out.Status == idem.InProgress:
		s.stats.inProgress.Add(1)
		return nil, newStatus(codes.Aborted, ReasonInProgress, "a call with this idempotency key is being processed; retry later with the same key", s.o.InProgressRetryAfter).Err()
	case out.Status == idem.FingerprintMismatch:
		s.stats.keyReused.Add(1)
		s.stats.rejected.Add(1)
		return nil, newStatus(codes.FailedPrecondition, ReasonKeyReused, "this idempotency key was used with another call (method or request message); use a new key", 0).Err()
	case out.Poison:
		s.o.Logger.Error("idemgrpc: record in an unexpected state", "consumer", s.consumer, "error", err)
		return nil, newStatus(codes.Internal, ReasonRecordCorrupt, "the record of this key is failed", 0).Err()
	}
	s.stats.storeErrors.Add(1)
	if errIsConfig(err) {
		s.o.Logger.Error("idemgrpc: store refused the claim", "consumer", s.consumer, "error", err)
		return nil, newStatus(codes.Internal, ReasonUnavailable, "the idempotency store refused the call", 0).Err()
	}
	if s.o.FailOpen && !errors.Is(err, idem.ErrClosed) {
		s.stats.failOpen.Add(1)
		s.o.Logger.Warn("idemgrpc: store unavailable, running without idempotency (FailOpen)", "consumer", s.consumer, "error", err)
		return handler(ctx, req)
	}
	s.o.Logger.Warn("idemgrpc: store unavailable", "consumer", s.consumer, "error", err)
	return nil, newStatus(codes.Unavailable, ReasonUnavailable, "the idempotency store is unavailable and nothing was run; retry with the same key", s.o.UnavailableRetryAfter).Err()
}

// replay answers a key whose record is completed.
func (s *Server) replay(ctx context.Context, out idem.Outcome) (any, error) {
	resp, st, err := decodeRecord(out.ContentType, out.Result)
	if err != nil {
		s.o.Logger.Error("idemgrpc: stored result undecodable", "consumer", s.consumer, "record", out.MessageID, "error", err)
		return nil, newStatus(codes.Internal, ReasonRecordCorrupt, "the stored result of this key cannot be decoded; the call was not run again", 0).Err()
	}
	s.stats.replayed.Add(1)
	replayed := metadata.Pairs(MetadataReplayed, "true")
	_ = grpc.SetHeader(ctx, replayed)
	_ = grpc.SetTrailer(ctx, replayed)
	if st.Code() != codes.OK {
		return nil, st.Err()
	}
	return resp, nil
}

// run runs the handler holding the attempt's lease (renewed by the lease
// engine), then completes or releases the key.
func (s *Server) run(req any, handler grpc.UnaryHandler, a *idem.Attempt) (any, error) {
	s.stats.executed.Add(1)
	if s.atMostOnce() {
		if _, ok := unsettled(a); ok {
			return s.answerUnknown(a)
		}
		// The recovery point goes first: if this process dies while the
		// handler works, the attempt that takes the key over finds it and
		// does not run the call again.
		tok := strconv.FormatInt(a.Token, 10)
		if err := s.retryWrite(a, func(ctx context.Context) error { return a.SaveStep(ctx, runStepPrefix+tok, nil) }); err != nil {
			s.o.Logger.Warn("idemgrpc: could not record the recovery point; nothing was run", "consumer", s.consumer, "record", a.Message.ID, "error", err)
			relErr := s.release(a, errors.New("recovery point not recorded"))
			if errors.Is(err, idem.ErrLeaseLost) || errors.Is(relErr, idem.ErrLeaseLost) {
				return nil, s.leaseLost()
			}
			return nil, newStatus(codes.Unavailable, ReasonUnavailable, "the idempotency store is unavailable and nothing was run; retry with the same key", s.o.UnavailableRetryAfter).Err()
		}
	}
	resp, herr := s.call(req, handler, a)
	if errors.Is(context.Cause(a.LeaseContext()), idem.ErrLeaseLost) {
		s.stats.leaseLost.Add(1)
	}
	st := status.Convert(herr)
	if s.o.ReleaseCode(st.Code()) {
		_ = s.release(a, fmt.Errorf("idemgrpc: code %v released the key; the retry runs the handler again", st.Code()))
		return resp, herr
	}
	rec, err := encodeRecord(st, resp)
	if err != nil {
		s.o.Logger.Error("idemgrpc: result cannot be stored; key released", "consumer", s.consumer, "record", a.Message.ID, "error", err)
		_ = s.release(a, err)
		return resp, herr
	}
	if err := s.complete(a, rec); err != nil {
		s.o.Logger.Error("idemgrpc: could not record the result before the lease ended",
			"consumer", s.consumer, "record", a.Message.ID, "attempt", a.Number, "error", err)
		if errors.Is(err, idem.ErrLeaseLost) && !errors.Is(err, idem.ErrStore) {
			return nil, s.leaseLost()
		}
		what := "may run it again"
		if s.atMostOnce() {
			what = "is answered that its outcome is unknown"
		}
		return nil, newStatus(codes.Unavailable, ReasonNotRecorded, "the call ran but its result could not be recorded before this attempt's lease ended; a retry with the same key "+what, s.o.Lease).Err()
	}
	s.stats.completed.Add(1)
	return resp, herr
}

// call runs the handler on the attempt's context (cancelled with cause
// idem.ErrLeaseLost if the lease is lost). A panic releases the key and
// goes on up: a recovery interceptor outside this one turns it into an
// answer, as it would without idempotency.
func (s *Server) call(req any, handler grpc.UnaryHandler, a *idem.Attempt) (resp any, err error) {
	done := false
	defer func() {
		if done {
			return
		}
		v := recover()
		s.stats.panics.Add(1)
		s.o.Logger.Error("idemgrpc: handler panicked; key released", "consumer", s.consumer, "record", a.Message.ID, "panic", v)
		_ = s.release(a, fmt.Errorf("%w: %v", idem.ErrHandlerPanic, v))
		panic(v)
	}()
	resp, err = handler(a.Context(), req)
	done = true
	return resp, err
}

// leaseLost is the answer of an attempt that another took over.
func (s *Server) leaseLost() error {
	s.stats.leaseLost.Add(1)
	return newStatus(codes.Aborted, ReasonLeaseLost, "another attempt took this idempotency key over; retry with the same key to get its result", s.o.InProgressRetryAfter).Err()
}

// answerUnknown stores and returns the outcome-unknown answer for a key
// whose earlier attempt may have acted and never recorded its result: the
// call is not run again, and every retry gets the same.
func (s *Server) answerUnknown(a *idem.Attempt) (any, error) {
	s.stats.unknown.Add(1)
	s.o.Logger.Warn("idemgrpc: an earlier attempt ran and never recorded its result; storing outcome-unknown",
		"consumer", s.consumer, "record", a.Message.ID, "attempt", a.Number)
	st := newStatus(codes.Unknown, ReasonOutcomeUnknown, "an earlier attempt with this idempotency key ran and ended without recording its result (its process stopped or lost the store); whether it took effect is unknown, so it is not run again. This answer is stored for the key", 0)
	rec, err := encodeRecord(st, nil)
	if err == nil {
		err = s.complete(a, rec)
	}
	if err != nil {
		s.o.Logger.Error("idemgrpc: could not record outcome-unknown", "consumer", s.consumer, "record", a.Message.ID, "error", err)
	}
	return nil, st.Err()
}

// atMostOnce reports whether a recovery point is recorded before the
// handler runs and outcome-unknown answered after a crash.
func (s *Server) atMostOnce() bool { return s.o.AfterCrash == idemhttp.AnswerUnknownAfterCrash }

// unsettled returns the token of an earlier attempt that saved a run
// point and no settled point: it may have acted, and it never recorded
// its result nor released the key with a known outcome.
func unsettled(a *idem.Attempt) (string, bool) {
	steps := a.Steps()
	for name := range steps {
		tok, ok := strings.CutPrefix(name, runStepPrefix)
		if _, settled := steps[settledStepPrefix+tok]; ok && !settled {
			return tok, true
		}
	}
	return "", false
}

// retryWrite calls write, each call bounded by StoreTimeout, retrying
// store failures (idem.ErrStore) with backoff while the attempt holds its
// lease, for at most one Lease; other errors (idem.ErrLeaseLost, a
// refused write) end it at once. The retries go on after the client left.
func (s *Server) retryWrite(a *idem.Attempt, write func(ctx context.Context) error) error {
	lctx := a.LeaseContext()
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval = 20*time.Millisecond, time.Second
	_, err := backoff.Retry(lctx, func() (struct{}, error) {
		ctx, cancel := context.WithTimeout(lctx, s.o.StoreTimeout)
		defer cancel()
		err := write(ctx)
		if err == nil || !errors.Is(err, idem.ErrStore) || errors.Is(err, idem.ErrLeaseLost) {
			return struct{}{}, backoff.Permanent(err)
		}
		s.stats.storeErrors.Add(1)
		return struct{}{}, err
	}, backoff.WithBackOff(b), backoff.WithMaxElapsedTime(s.o.Lease))
	if err != nil && lctx.Err() != nil && !errors.Is(err, idem.ErrLeaseLost) {
		err = errors.Join(err, context.Cause(lctx))
	}
	return err
}

// complete records rec as the key's result (retried while the lease is
// held) and ends the attempt; nil when it was recorded.
func (s *Server) complete(a *idem.Attempt, rec []byte) error {
	res := idem.Result{Body: rec, ContentType: recordContentType}
	err := s.retryWrite(a, func(ctx context.Context) error {
		_, err := a.Complete(ctx, res)
		return err
	})
	if err != nil {
		_, _ = a.Abandon(context.WithoutCancel(a.Context()), err)
	}
	return err
}

// release releases the key after cause so the next retry runs (retried
// while the lease is held), first recording, in at-most-once mode, that
// this attempt's outcome is known. It returns nil, or the error that kept
// the key from being released; the lease then runs out and a later
// attempt takes over.
func (s *Server) release(a *idem.Attempt, cause error) error {
	s.stats.released.Add(1)
	var err error
	if s.atMostOnce() {
		tok := strconv.FormatInt(a.Token, 10)
		err = s.retryWrite(a, func(ctx context.Context) error { return a.SaveStep(ctx, settledStepPrefix+tok, nil) })
	}
	if err == nil {
		err = s.retryWrite(a, func(ctx context.Context) error {
			_, err := a.Release(ctx, cause)
			if err != nil && !errors.Is(err, idem.ErrStore) && !errors.Is(err, idem.ErrLeaseLost) {
				return nil // the cause itself: released
			}
			return err
		})
	}
	if err != nil {
		s.o.Logger.Warn("idemgrpc: could not release the key; it frees when its lease runs out", "consumer", s.consumer, "record", a.Message.ID, "error", err)
		_, _ = a.Abandon(context.WithoutCancel(a.Context()), errors.Join(cause, err))
	}
	return err
}

package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/internal/keyed"
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
	fin      keyed.Finisher // the final writes of an attempt

	stats struct {
		passThrough, executed, replayed, inProgress, waited, keyReused, released,
		completed, rejected, storeErrors, failOpen, leaseLost, panics, unknown atomic.Int64
	}
}

// Stats counts what a Server did since New, in calls, with the meaning of
// the fields of idemhttp.Stats of the same name: PassThrough (not
// covered, or no key where none is required), Executed (the handler ran
// holding the lease, or the attempt answered outcome-unknown), Replayed,
// InProgress (ABORTED request-in-progress), Waited (duplicates that
// waited for the first call, Options.Wait), KeyReused
// (FAILED_PRECONDITION), Released (a code that ReleaseCode selects, a
// panic, a result that cannot be stored), Completed (the result was
// recorded), Rejected (INVALID_ARGUMENT, UNAUTHENTICATED or
// FAILED_PRECONDITION before any handler ran), StoreErrors (failed store
// calls), FailOpen (runs without idempotency, Options.FailOpen),
// LeaseLost, Panics and Unknown (outcome-unknown stored instead of a run,
// idemhttp.AnswerUnknownAfterCrash).
type Stats struct {
	PassThrough, Executed, Replayed, InProgress, Waited, KeyReused, Released, Completed int64
	Rejected, StoreErrors, FailOpen, LeaseLost, Panics, Unknown                         int64
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
	s.fin = keyed.Finisher{
		Name: "idemgrpc", Consumer: s.consumer, Lease: o.Lease, StoreTimeout: o.StoreTimeout,
		AtMostOnce: s.atMostOnce(), Logger: o.Logger, StoreErrors: &s.stats.storeErrors, Released: &s.stats.released,
	}
	s.lc, err = keyed.NewLeaseConsumer(store, s.consumer, idem.Config{
		RetentionWindow: o.Retention,
		PurgeInterval:   o.PurgeInterval,
		PurgeBatchSize:  o.PurgeBatchSize,
		Logger:          o.Logger,
		Hooks:           o.Hooks,
		Lease:           o.Lease,
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
func (s *Server) RecordID(scope, key string) string { return keyed.RecordID(scope, key) }

// Stats returns the counters.
func (s *Server) Stats() Stats {
	c := &s.stats
	return Stats{
		PassThrough: c.passThrough.Load(), Executed: c.executed.Load(), Replayed: c.replayed.Load(),
		InProgress: c.inProgress.Load(), Waited: c.waited.Load(), KeyReused: c.keyReused.Load(), Released: c.released.Load(),
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
	opt := idem.AcquireOptions{Wait: s.o.Wait, OnWait: func() { s.stats.waited.Add(1) }}
	if s.atMostOnce() {
		// The recovery point is saved with the acquisition, before the
		// handler runs: if this process dies while the handler works, the
		// attempt that takes the key over finds it and does not run the
		// call again.
		opt.StepPrefix = s.fin.RunPrefix()
	}
	a, out, err := s.lc.Acquire(ctx, idem.Message{ID: s.RecordID(scope, key), Payload: fp}, opt)
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
	if keyed.IsConfigError(err) {
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
	r, err := decodeRecord(out.ContentType, out.Result)
	if err != nil {
		s.o.Logger.Error("idemgrpc: stored result undecodable", "consumer", s.consumer, "record", out.MessageID, "error", err)
		return nil, newStatus(codes.Internal, ReasonRecordCorrupt, "the stored result of this key cannot be decoded; the call was not run again", 0).Err()
	}
	s.stats.replayed.Add(1)
	replayed := metadata.Pairs(MetadataReplayed, "true")
	_ = grpc.SetHeader(ctx, metadata.Join(r.header, replayed))
	_ = grpc.SetTrailer(ctx, metadata.Join(r.trailer, replayed))
	if r.st.Code() != codes.OK {
		return nil, r.st.Err()
	}
	return r.resp, nil
}

// run runs the handler holding the attempt's lease (renewed by the lease
// engine), then completes or releases the key.
func (s *Server) run(req any, handler grpc.UnaryHandler, a *idem.Attempt) (any, error) {
	s.stats.executed.Add(1)
	if s.atMostOnce() {
		if _, ok := s.fin.Unsettled(a); ok {
			return s.answerUnknown(a)
		}
	}
	resp, md, herr := s.call(req, handler, a)
	if errors.Is(context.Cause(a.LeaseContext()), idem.ErrLeaseLost) {
		s.stats.leaseLost.Add(1)
	}
	st := status.Convert(herr)
	if s.o.ReleaseCode(st.Code()) {
		_ = s.fin.Release(a, fmt.Errorf("idemgrpc: code %v released the key; the retry runs the handler again", st.Code()))
		return resp, herr
	}
	header, trailer := md.snapshot()
	rec, err := encodeRecord(record{resp: resp, st: st, header: header, trailer: trailer})
	if err != nil {
		s.o.Logger.Error("idemgrpc: result cannot be stored; key released", "consumer", s.consumer, "record", a.Message.ID, "error", err)
		_ = s.fin.Release(a, err)
		return resp, herr
	}
	if err := s.fin.Complete(a, idem.Result{Body: rec, ContentType: recordContentType}); err != nil {
		s.o.Logger.Error("idemgrpc: could not record the result before the lease ended",
			"consumer", s.consumer, "record", a.Message.ID, "attempt", a.Number, "error", err)
		if errors.Is(err, idem.ErrLeaseLost) && !errors.Is(err, idem.ErrStore) {
			return nil, s.leaseLost()
		}
		what := "may run it again"
		if s.atMostOnce() {
			what = "gets this result if its recording landed after all, and otherwise is answered that its outcome is unknown"
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
//
// The metadata the handler sets (grpc.SetHeader, grpc.SendHeader,
// grpc.SetTrailer) goes to the client as usual and is recorded too, to be
// replayed.
func (s *Server) call(req any, handler grpc.UnaryHandler, a *idem.Attempt) (resp any, md *mdRecorder, err error) {
	done := false
	defer func() {
		if done {
			return
		}
		v := recover()
		s.stats.panics.Add(1)
		s.o.Logger.Error("idemgrpc: handler panicked; key released", "consumer", s.consumer, "record", a.Message.ID, "panic", v)
		_ = s.fin.Release(a, fmt.Errorf("%w: %v", idem.ErrHandlerPanic, v))
		panic(v)
	}()
	ctx := a.Context()
	md = &mdRecorder{ServerTransportStream: grpc.ServerTransportStreamFromContext(ctx)}
	if md.ServerTransportStream != nil {
		ctx = grpc.NewContextWithServerTransportStream(ctx, md)
	}
	resp, err = handler(ctx, req)
	done = true
	return resp, md, err
}

// mdRecorder is the call's transport stream, recording the metadata the
// handler sets.
type mdRecorder struct {
	grpc.ServerTransportStream
	mu              sync.Mutex
	header, trailer metadata.MD
}

func (r *mdRecorder) add(to *metadata.MD, md metadata.MD) {
	r.mu.Lock()
	*to = metadata.Join(*to, md)
	r.mu.Unlock()
}

// snapshot returns what was recorded.
func (r *mdRecorder) snapshot() (header, trailer metadata.MD) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.header.Copy(), r.trailer.Copy()
}

// SetHeader records md and passes it on.
func (r *mdRecorder) SetHeader(md metadata.MD) error {
	r.add(&r.header, md)
	return r.ServerTransportStream.SetHeader(md)
}

// SendHeader records md and passes it on.
func (r *mdRecorder) SendHeader(md metadata.MD) error {
	r.add(&r.header, md)
	return r.ServerTransportStream.SendHeader(md)
}

// SetTrailer records md and passes it on.
func (r *mdRecorder) SetTrailer(md metadata.MD) error {
	r.add(&r.trailer, md)
	return r.ServerTransportStream.SetTrailer(md)
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
	rec, err := encodeRecord(record{st: st})
	if err == nil {
		err = s.fin.Complete(a, idem.Result{Body: rec, ContentType: recordContentType})
	}
	if err != nil {
		s.o.Logger.Error("idemgrpc: could not record outcome-unknown", "consumer", s.consumer, "record", a.Message.ID, "error", err)
	}
	return nil, st.Err()
}

// atMostOnce reports whether a recovery point is recorded before the
// handler runs and outcome-unknown answered after a crash.
func (s *Server) atMostOnce() bool { return s.o.AfterCrash == idemhttp.AnswerUnknownAfterCrash }

package grpctest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemgrpc"
)

// The test service, registered by hand (no generated code): two unary
// methods taking a google.protobuf.StringValue and answering a
// google.protobuf.Struct {"n": execution number, "method": ..., "value": ...}.
const (
	serviceName  = "idemgrpc.test.Payments"
	methodCharge = "/" + serviceName + "/Charge"
	methodRefund = "/" + serviceName + "/Refund"
)

// handlerFunc is the body of the test service's methods; n is the
// execution count including this one.
type handlerFunc func(ctx context.Context, method string, n int64, req *wrapperspb.StringValue) (*structpb.Struct, error)

// service counts executions and runs h.
type service struct {
	n atomic.Int64
	h handlerFunc
}

// executed is the number of handler executions so far.
func (s *service) executed() int64 { return s.n.Load() }

func (s *service) serve(ctx context.Context, method string, req *wrapperspb.StringValue) (*structpb.Struct, error) {
	n := s.n.Add(1)
	if s.h != nil {
		return s.h(ctx, method, n, req)
	}
	return okReply(method, n, req)
}

func okReply(method string, n int64, req *wrapperspb.StringValue) (*structpb.Struct, error) {
	return structpb.NewStruct(map[string]any{"n": float64(n), "method": method, "value": req.GetValue()})
}

func methodDesc(name string) grpc.MethodDesc {
	full := "/" + serviceName + "/" + name
	return grpc.MethodDesc{MethodName: name, Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
		in := new(wrapperspb.StringValue)
		if err := dec(in); err != nil {
			return nil, err
		}
		h := func(ctx context.Context, req any) (any, error) {
			return srv.(*service).serve(ctx, full, req.(*wrapperspb.StringValue))
		}
		if ic == nil {
			return h(ctx, in)
		}
		return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: full}, h)
	}}
}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: serviceName,
	HandlerType: (*any)(nil),
	Methods:     []grpc.MethodDesc{methodDesc("Charge"), methodDesc("Refund")},
}

// scopeFromMetadata is the tests' Scope: the "user" metadata entry.
func scopeFromMetadata(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if u := md.Get("user"); len(u) == 1 {
		return u[0], nil
	}
	return "", nil
}

// instance is one gRPC server process with the interceptor.
type instance struct {
	idem *idemgrpc.Server
	gs   *grpc.Server
	addr string
}

// startOn serves svc on addr ("127.0.0.1:0" for a free port) behind the
// interceptor over store; opts.Scope and Namespace default to the tests'.
// extra interceptors run before the idempotency one.
func startOn(t testing.TB, addr string, store idemdriver.LeaseStore, opts idemgrpc.Options, svc *service, extra ...grpc.UnaryServerInterceptor) *instance {
	t.Helper()
	if opts.Scope == nil {
		opts.Scope = scopeFromMetadata
	}
	if opts.Namespace == "" {
		opts.Namespace = "payments"
	}
	if opts.PurgeInterval == 0 {
		opts.PurgeInterval = -1
	}
	s, err := idemgrpc.New(store, opts)
	if err != nil {
		t.Fatalf("idemgrpc.New: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(append(extra, s.UnaryServerInterceptor())...))
	gs.RegisterService(&serviceDesc, svc)
	var wg sync.WaitGroup
	wg.Go(func() { _ = gs.Serve(lis) })
	t.Cleanup(func() { gs.Stop(); wg.Wait() })
	return &instance{idem: s, gs: gs, addr: lis.Addr().String()}
}

// dial returns a client connection to addr, with the idempotency client
// interceptor when copts is not nil.
func dial(t testing.TB, addr string, copts *idemgrpc.ClientOptions) *grpc.ClientConn {
	t.Helper()
	dopts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if copts != nil {
		ic, err := idemgrpc.NewClientInterceptor(copts)
		if err != nil {
			t.Fatalf("NewClientInterceptor: %v", err)
		}
		dopts = append(dopts, grpc.WithUnaryInterceptor(ic))
	}
	cc, err := grpc.NewClient(addr, dopts...)
	if err != nil {
		t.Fatalf("grpc.NewClient: %v", err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// result is what a call got.
type result struct {
	reply           *structpb.Struct
	header, trailer metadata.MD
	err             error
}

// call makes one call as user with key (none when empty) and value.
func call(ctx context.Context, cc *grpc.ClientConn, method, user, key, value string) result {
	md := metadata.Pairs("user", user)
	if key != "" {
		md.Append(idemgrpc.MetadataKey, key)
	}
	ctx = metadata.NewOutgoingContext(ctx, md)
	var r result
	r.reply = new(structpb.Struct)
	r.err = cc.Invoke(ctx, method, wrapperspb.String(value), r.reply, grpc.Header(&r.header), grpc.Trailer(&r.trailer))
	return r
}

func (r result) replayed() bool {
	v := r.header.Get(idemgrpc.MetadataReplayed)
	return len(v) == 1 && v[0] == "true"
}

func (r result) n() int64 { return int64(r.reply.GetFields()["n"].GetNumberValue()) }

// wantOK fails unless r succeeded with execution number n and the given
// replay marker.
func wantOK(t *testing.T, r result, n int64, replayed bool) {
	t.Helper()
	if r.err != nil {
		t.Fatalf("call failed: %v", r.err)
	}
	if r.n() != n || r.replayed() != replayed {
		t.Fatalf("reply n=%d replayed=%v (header %v), want n=%d replayed=%v", r.n(), r.replayed(), r.header, n, replayed)
	}
}

// wantCode fails unless r failed with code and, when reason is not
// empty, the interceptor's reason.
func wantCode(t *testing.T, r result, code codes.Code, reason string) {
	t.Helper()
	if status.Code(r.err) != code || idemgrpc.Reason(r.err) != reason {
		t.Fatalf("got %v (reason %q), want %v reason %q", r.err, idemgrpc.Reason(r.err), code, reason)
	}
}

func wantExecuted(t *testing.T, svc *service, n int64) {
	t.Helper()
	if got := svc.executed(); got != n {
		t.Fatalf("handler executed %d times, want %d", got, n)
	}
}

// gate blocks handlers until opened, and counts those that reached it.
type gate struct {
	ch      chan struct{}
	once    sync.Once
	arrived chan struct{}
}

func newGate(t *testing.T) *gate {
	g := &gate{ch: make(chan struct{}), arrived: make(chan struct{}, 100)}
	t.Cleanup(g.open)
	return g
}

// wait blocks until the gate opens; it ignores the call's context, as a
// handler stuck in a call that does not honour it would.
func (g *gate) wait() {
	g.arrived <- struct{}{}
	<-g.ch
}

func (g *gate) open() { g.once.Do(func() { close(g.ch) }) }

// reached waits for one handler to reach the gate.
func (g *gate) reached(t *testing.T) {
	t.Helper()
	select {
	case <-g.arrived:
	case <-time.After(time.Minute):
		t.Fatal("no handler reached the gate")
	}
}

// errInjected is the failure a faultStore injects.
var errInjected = errors.New("injected store failure")

// faultStore fails chosen calls of a real store, as an outage or a dead
// process would.
type faultStore struct {
	idemdriver.LeaseStore
	down atomic.Bool // every call fails
	dead atomic.Bool // Renew, SaveStep, Complete and Release fail (the process died)
	// failComplete makes Complete fail.
	failComplete atomic.Bool
}

func (f *faultStore) fail(final bool) error {
	if f.down.Load() || (final && f.dead.Load()) {
		return fmt.Errorf("%w", errInjected)
	}
	return nil
}

func (f *faultStore) Acquire(ctx context.Context, p *idemdriver.AcquireParams) (idemdriver.AcquireResult, error) {
	if err := f.fail(false); err != nil {
		return idemdriver.AcquireResult{}, err
	}
	return f.LeaseStore.Acquire(ctx, p)
}

func (f *faultStore) Renew(ctx context.Context, p *idemdriver.RenewParams) error {
	if err := f.fail(true); err != nil {
		return err
	}
	return f.LeaseStore.Renew(ctx, p)
}

func (f *faultStore) SaveStep(ctx context.Context, p *idemdriver.StepParams) error {
	if err := f.fail(true); err != nil {
		return err
	}
	return f.LeaseStore.SaveStep(ctx, p)
}

func (f *faultStore) Complete(ctx context.Context, p *idemdriver.CompleteParams) error {
	if err := f.fail(true); err != nil {
		return err
	}
	if f.failComplete.Load() {
		return errInjected
	}
	return f.LeaseStore.Complete(ctx, p)
}

func (f *faultStore) Release(ctx context.Context, p *idemdriver.ReleaseParams) error {
	if err := f.fail(true); err != nil {
		return err
	}
	return f.LeaseStore.Release(ctx, p)
}

// quietLogger discards the warnings that scenarios provoke on purpose.
func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// statusErr is a status error with code c.
func statusErr(c codes.Code) error { return status.Error(c, c.String()) }

package grpctest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemgrpc"
)

// keyRecorder is an outer server interceptor that records the key of
// every attempt and, for the first attempt of each key, drops the
// response after the call ran (as a broken connection would).
type keyRecorder struct {
	mu   sync.Mutex
	keys []string
	drop bool
}

func (k *keyRecorder) intercept(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	key := ""
	if v := md.Get(idemgrpc.MetadataKey); len(v) == 1 {
		key = v[0]
	}
	k.mu.Lock()
	first := true
	for _, seen := range k.keys {
		first = first && seen != key
	}
	k.keys = append(k.keys, key)
	k.mu.Unlock()
	resp, err := h(ctx, req)
	if k.drop && first {
		return nil, status.Error(codes.Unavailable, "response lost")
	}
	return resp, err
}

func (k *keyRecorder) seen() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.keys...)
}

// TestClientOneKeyPerCall: every attempt of a logical call carries the
// same generated key, so the retry after a lost response is a replay; the
// next logical call gets another key.
func TestClientOneKeyPerCall(t *testing.T) {
	t.Parallel()
	svc := &service{}
	rec := &keyRecorder{drop: true}
	in := startOn(t, "127.0.0.1:0", idem.NewMemoryStore(nil), idemgrpc.Options{}, svc, rec.intercept)
	cc := dial(t, in.addr, &idemgrpc.ClientOptions{InitialInterval: time.Millisecond, MaxInterval: time.Millisecond})
	ctx := bg(t)
	r := call(ctx, cc, methodCharge, "alice", "", "10 EUR")
	wantOK(t, r, 1, true)
	r2 := call(ctx, cc, methodCharge, "alice", "", "10 EUR")
	wantOK(t, r2, 2, true)
	wantExecuted(t, svc, 2)
	keys := rec.seen()
	if len(keys) != 4 || keys[0] == "" || keys[0] != keys[1] || keys[2] != keys[3] || keys[1] == keys[2] {
		t.Fatalf("keys per attempt %q: want two attempts per call, one key per call", keys)
	}
}

// TestClientCallerKey: a key in the outgoing metadata or from
// ContextWithKey is sent instead of a generated one, the metadata's first.
func TestClientCallerKey(t *testing.T) {
	t.Parallel()
	rec := &keyRecorder{}
	in := startOn(t, "127.0.0.1:0", idem.NewMemoryStore(nil), idemgrpc.Options{}, &service{}, rec.intercept)
	cc := dial(t, in.addr, &idemgrpc.ClientOptions{})
	ctx := idemgrpc.ContextWithKey(bg(t), "order-42")
	wantOK(t, call(ctx, cc, methodCharge, "alice", "", "x"), 1, false)
	wantOK(t, call(ctx, cc, methodCharge, "alice", "", "x"), 1, true)
	wantOK(t, call(ctx, cc, methodCharge, "alice", "order-43", "x"), 2, false)
	if keys := rec.seen(); len(keys) != 3 || keys[0] != "order-42" || keys[1] != "order-42" || keys[2] != "order-43" {
		t.Fatalf("keys %q", keys)
	}
}

// TestClientRetriesOnlyWhatIsSafe: a reused key, an application error
// and outcome-unknown are returned at once; UNAVAILABLE is retried with
// the server's RetryInfo (capped by MaxRetryAfter) until MaxAttempts,
// then returned as a *RetryError that keeps the status.
func TestClientRetriesOnlyWhatIsSafe(t *testing.T) {
	t.Parallel()
	svc := &service{}
	store := idem.NewMemoryStore(nil)
	in := startOn(t, "127.0.0.1:0", store, idemgrpc.Options{}, svc)
	var mu sync.Mutex
	var waits []time.Duration
	copts := &idemgrpc.ClientOptions{MaxAttempts: 3, MaxRetryAfter: 5 * time.Millisecond,
		OnRetry: func(_ string, _ int, _ error, wait time.Duration) {
			mu.Lock()
			waits = append(waits, wait)
			mu.Unlock()
		}}
	cc := dial(t, in.addr, copts)
	ctx := bg(t)
	wantOK(t, call(ctx, cc, methodCharge, "alice", "k1", "a"), 1, false)
	r := call(ctx, cc, methodCharge, "alice", "k1", "b")
	wantCode(t, r, codes.FailedPrecondition, idemgrpc.ReasonKeyReused)
	wantCode(t, call(ctx, cc, methodCharge, "alice", "bad, key", "a"), codes.InvalidArgument, idemgrpc.ReasonKeyInvalid)
	if len(waits) != 0 {
		t.Fatalf("retried %d times: want none", len(waits))
	}

	fs := &faultStore{LeaseStore: store}
	fs.down.Store(true)
	down := startOn(t, "127.0.0.1:0", fs, idemgrpc.Options{Logger: quietLogger()}, svc)
	r = call(ctx, dial(t, down.addr, copts), methodCharge, "alice", "k2", "a")
	var re *idemgrpc.RetryError
	if !errors.As(r.err, &re) || re.Attempts != 3 || re.Key != "k2" || status.Code(r.err) != codes.Unavailable {
		t.Fatalf("store down: %v, want a RetryError after 3 attempts with UNAVAILABLE", r.err)
	}
	if len(waits) != 2 || waits[0] != 5*time.Millisecond || waits[1] != 5*time.Millisecond {
		t.Fatalf("waits %v: want the server's 2s RetryInfo capped at 5ms, twice", waits)
	}
	wantExecuted(t, svc, 1)

	// With one attempt allowed, a code that is never retried comes back
	// as the status error itself (backoff's Permanent wrapper used to be
	// returned when the tries ran out on it).
	one := dial(t, in.addr, &idemgrpc.ClientOptions{MaxAttempts: 1})
	r = call(ctx, one, methodCharge, "alice", "k1", "b")
	if _, ok := r.err.(interface{ GRPCStatus() *status.Status }); !ok || status.Code(r.err) != codes.FailedPrecondition {
		t.Fatalf("MaxAttempts 1: %T %v, want the FAILED_PRECONDITION status error itself", r.err, r.err)
	}
}

// TestOptionsValidation: bad options are typed errors.
func TestOptionsValidation(t *testing.T) {
	t.Parallel()
	s := idem.NewMemoryStore(nil)
	if _, err := idemgrpc.New(s, idemgrpc.Options{Namespace: "x"}); !errors.Is(err, idemgrpc.ErrNoScope) || !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("no scope: %v", err)
	}
	for _, o := range []idemgrpc.Options{
		{Scope: scopeFromMetadata},
		{Scope: scopeFromMetadata, Namespace: "x", Lease: time.Millisecond},
		{Scope: scopeFromMetadata, Namespace: "x", MaxKeyLength: 256},
		{Scope: scopeFromMetadata, Namespace: "x", AfterCrash: 9},
	} {
		if _, err := idemgrpc.New(s, o); !errors.Is(err, idemgrpc.ErrInvalidOptions) {
			t.Fatalf("%+v: %v, want ErrInvalidOptions", o, err)
		}
	}
	for _, o := range []idemgrpc.ClientOptions{{MaxAttempts: -1}, {Multiplier: 0.5}, {InitialInterval: time.Second, MaxInterval: time.Millisecond}} {
		if _, err := idemgrpc.NewClientInterceptor(&o); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Fatalf("%+v: %v, want ErrInvalidConfig", o, err)
		}
	}
}

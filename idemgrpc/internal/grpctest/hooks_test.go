package grpctest

import (
	"context"
	"slices"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemgrpc"
)

// outcomes records the core's outcome events.
type outcomes struct {
	mu  sync.Mutex
	got []idem.Status
}

func (o *outcomes) OnOutcome(_ context.Context, e idem.OutcomeEvent) {
	o.mu.Lock()
	o.got = append(o.got, e.Outcome.Status)
	o.mu.Unlock()
}

// TestHooks: each call on the idempotency path is one lease-mode delivery
// of the consumer "idemgrpc:"+Namespace, reported by the core's hooks:
// Processed, Duplicate, FingerprintMismatch, Failed (released); calls
// that pass through report nothing.
func TestHooks(t *testing.T) {
	t.Parallel()
	o := &outcomes{}
	svc := &service{h: func(_ context.Context, m string, n int64, req *wrapperspb.StringValue) (*structpb.Struct, error) {
		if req.GetValue() == "fail" {
			return nil, errUnavailable
		}
		return okReply(m, n, req)
	}}
	in := startOn(t, "127.0.0.1:0", idem.NewMemoryStore(nil), idemgrpc.Options{Hooks: []idem.Hook{o}}, svc)
	cc := dial(t, in.addr, nil)
	ctx := bg(t)
	call(ctx, cc, methodCharge, "alice", "k1", "x")
	call(ctx, cc, methodCharge, "alice", "k1", "x")
	call(ctx, cc, methodCharge, "alice", "k1", "y")
	call(ctx, cc, methodCharge, "alice", "k2", "fail")
	call(ctx, cc, methodCharge, "alice", "", "x")
	want := []idem.Status{idem.Processed, idem.Duplicate, idem.FingerprintMismatch, idem.Failed}
	o.mu.Lock()
	defer o.mu.Unlock()
	if !slices.Equal(o.got, want) {
		t.Fatalf("outcomes %v, want %v", o.got, want)
	}
	if in.idem.Consumer() != "idemgrpc:payments" {
		t.Fatalf("consumer %q", in.idem.Consumer())
	}
}

// TestFingerprint: deterministic over map order, and distinct per method
// and per request.
func TestFingerprint(t *testing.T) {
	t.Parallel()
	m := map[string]any{}
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		m[k] = k
	}
	fp := func(method string, v map[string]any) string {
		s, err := structpb.NewStruct(v)
		if err != nil {
			t.Fatal(err)
		}
		b, err := idemgrpc.Fingerprint(method, s)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	first := fp(methodCharge, m)
	for range 20 {
		if fp(methodCharge, m) != first {
			t.Fatal("fingerprint of the same map differs")
		}
	}
	if fp(methodRefund, m) == first || fp(methodCharge, map[string]any{"a": "a"}) == first {
		t.Fatal("fingerprint ignores the method or the request")
	}
}

var errUnavailable = statusErr(codes.Unavailable)

package grpctest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemgrpc"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/internal/testenv"
)

// testLease is the lease of the scenarios that wait for one to run out:
// long enough that renewals land on a loaded store, short enough to wait.
const testLease = 2 * time.Second

// storeEnv is one store under test, shared by its scenarios; each
// scenario uses its own namespace.
type storeEnv struct {
	first, second idemdriver.LeaseStore
}

// scenario is one behaviour, checked on every store.
type scenario struct {
	name string
	run  func(t *testing.T, e storeEnv, ns string)
}

// TestScenarios runs every scenario on every store, through a real gRPC
// server and client on loopback.
func TestScenarios(t *testing.T) {
	t.Parallel()
	for _, k := range storeKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			first, second := k.open(t)
			e := storeEnv{first: first, second: second}
			for _, sc := range scenarios {
				t.Run(sc.name, func(t *testing.T) {
					t.Parallel()
					sc.run(t, e, randName("ns-"))
				})
			}
		})
	}
}

var scenarios = []scenario{
	{"Replay", func(t *testing.T, e storeEnv, ns string) {
		// The handler's metadata is replayed too: a header, and a binary
		// trailer.
		svc := &service{h: func(ctx context.Context, m string, n int64, req *wrapperspb.StringValue) (*structpb.Struct, error) {
			_ = grpc.SetHeader(ctx, metadata.Pairs("x-charge-id", fmt.Sprint("ch_", n)))
			_ = grpc.SetTrailer(ctx, metadata.Pairs("x-ledger-bin", string([]byte{0, 0xff, byte(n)})))
			return okReply(m, n, req)
		}}
		wantMD := func(r result, n int64) {
			t.Helper()
			if h, tr := r.header.Get("x-charge-id"), r.trailer.Get("x-ledger-bin"); len(h) != 1 || h[0] != fmt.Sprint("ch_", n) ||
				len(tr) != 1 || tr[0] != string([]byte{0, 0xff, byte(n)}) {
				t.Fatalf("header %v trailer %v: want the handler's metadata of run %d", r.header, r.trailer, n)
			}
		}
		in := startOn(t, "127.0.0.1:0", e.first, idemgrpc.Options{Namespace: ns}, svc)
		cc := dial(t, in.addr, nil)
		ctx := bg(t)
		r := call(ctx, cc, methodCharge, "alice", "k1", "10 EUR")
		wantOK(t, r, 1, false)
		wantMD(r, 1)
		if got := r.header.Get(idemgrpc.MetadataKey); len(got) != 1 || got[0] != "k1" {
			t.Fatalf("header %s = %q, want the key echoed", idemgrpc.MetadataKey, got)
		}
		for range 3 {
			rr := call(ctx, cc, methodCharge, "alice", "k1", "10 EUR")
			wantOK(t, rr, 1, true)
			wantMD(rr, 1)
			if !proto.Equal(rr.reply, r.reply) {
				t.Fatalf("replay %v, want %v", rr.reply, r.reply)
			}
			if v := rr.trailer.Get(idemgrpc.MetadataReplayed); len(v) != 1 || v[0] != "true" {
				t.Fatalf("trailer %v: want %s: true", rr.trailer, idemgrpc.MetadataReplayed)
			}
		}
		// The sf-string form of the same key is the same key.
		wantOK(t, call(ctx, cc, methodCharge, "alice", `"k1"`, "10 EUR"), 1, true)
		// Another key runs again: no dedupe by content.
		wantOK(t, call(ctx, cc, methodCharge, "alice", "k2", "10 EUR"), 2, false)
		wantExecuted(t, svc, 2)
		if s := in.idem.Stats(); s.Completed != 2 || s.Replayed != 4 || s.Executed != 2 {
			t.Fatalf("stats %+v", s)
		}
	}},
	{"StoredError", func(t *testing.T, e storeEnv, ns string) {
		svc := &service{h: func(_ context.Context, _ string, n int64, _ *wrapperspb.StringValue) (*structpb.Struct, error) {
			st, _ := status.New(codes.FailedPrecondition, fmt.Sprintf("card declined (run %d)", n)).
				WithDetails(&errdetails.ErrorInfo{Reason: "CARD_DECLINED", Domain: "payments.example", Metadata: map[string]string{"run": fmt.Sprint(n)}})
			return nil, st.Err()
		}}
		in := startOn(t, "127.0.0.1:0", e.first, idemgrpc.Options{Namespace: ns}, svc)
		cc := dial(t, in.addr, nil)
		ctx := bg(t)
		first := call(ctx, cc, methodCharge, "alice", "k1", "10 EUR")
		for i := range 3 {
			r := call(ctx, cc, methodCharge, "alice", "k1", "10 EUR")
			if r.replayed() != true || !proto.Equal(status.Convert(r.err).Proto(), status.Convert(first.err).Proto()) {
				t.Fatalf("retry %d: %v (replayed %v), want the stored %v", i, r.err, r.replayed(), first.err)
			}
		}
		if status.Code(first.err) != codes.FailedPrecondition || len(status.Convert(first.err).Details()) != 1 {
			t.Fatalf("first call: %v", first.err)
		}
		wantExecuted(t, svc, 1)
	}},
	{"InFlight", func(t *testing.T, e storeEnv, ns string) {
		g := newGate(t)
		svc := &service{h: func(_ context.Context, m string, n int64, req *wrapperspb.StringValue) (*structpb.Struct, error) {
			if req.GetValue() == "slow" {
				g.wait()
			}
			return okReply(m, n, req)
		}}
		in := startOn(t, "127.0.0.1:0", e.first, idemgrpc.Options{Namespace: ns, InProgressRetryAfter: 1500 * time.Millisecond}, svc)
		cc := dial(t, in.addr, nil)
		ctx := bg(t)
		first := make(chan result, 1)
		go func() { first <- call(ctx, cc, methodCharge, "alice", "k1", "slow") }()
		g.reached(t)
		dup := call(ctx, cc, methodCharge, "alice", "k1", "slow")
		wantCode(t, dup, codes.Aborted, idemgrpc.ReasonInProgress)
		if d, ok := idemgrpc.RetryDelay(dup.err); !ok || d != 1500*time.Millisecond {
			t.Fatalf("RetryInfo %v %v, want 1.5s", d, ok)
		}
		// Another key is not blocked by k1's lease.
		wantOK(t, call(ctx, cc, methodCharge, "alice", "k2", "fast"), 2, false)
		g.open()
		wantOK(t, <-first, 1, false)
		wantOK(t, call(ctx, cc, methodCharge, "alice", "k1", "slow"), 1, true)
		wantExecuted(t, svc, 2)
	}},
	{"KeyReused", func(t *testing.T, e storeEnv, ns string) {
		svc := &service{}
		in := startOn(t, "127.0.0.1:0", e.first, idemgrpc.Options{Namespace: ns}, svc)
		cc := dial(t, in.addr, nil)
		ctx := bg(t)
		wantOK(t, call(ctx, cc, methodCharge, "alice", "k1", "10 EUR"), 1, false)
		wantCode(t, call(ctx, cc, methodCharge, "alice", "k1", "20 EUR"), codes.FailedPrecondition, idemgrpc.ReasonKeyReused)
		wantCode(t, call(ctx, cc, methodRefund, "alice", "k1", "10 EUR"), codes.FailedPrecondition, idemgrpc.ReasonKeyReused)
		wantOK(t, call(ctx, cc, methodCharge, "alice", "k1", "10 EUR"), 1, true)
		wantExecuted(t, svc, 1)
	}},
	{"FailureReleases", func(t *testing.T, e storeEnv, ns string) {
		svc := &service{h: func(_ context.Context, m string, n int64, req *wrapperspb.StringValue) (*structpb.Struct, error) {
			switch n {
			case 1:
				return nil, status.Error(codes.Unavailable, "database restarting")
			case 2:
				panic("handler bug")
			case 3:
				return nil, status.Error(codes.Aborted, "transaction conflict")
			case 4:
				return nil, status.Error(codes.ResourceExhausted, "rate limited")
			}
			return okReply(m, n, req)
		}}
		in := startOn(t, "127.0.0.1:0", e.first, idemgrpc.Options{Namespace: ns, Logger: quietLogger()}, svc, recoverPanics)
		cc := dial(t, in.addr, nil)
		ctx := bg(t)
		for _, want := range []codes.Code{codes.Unavailable, codes.Internal, codes.Aborted, codes.ResourceExhausted} {
			r := call(ctx, cc, methodCharge, "alice", "k1", "10 EUR")
			wantCode(t, r, want, "")
			if r.replayed() {
				t.Fatalf("%v replayed", want)
			}
		}
		wantOK(t, call(ctx, cc, methodCharge, "alice", "k1", "10 EUR"), 5, false)
		wantOK(t, call(ctx, cc, methodCharge, "alice", "k1", "10 EUR"), 5, true)
		wantExecuted(t, svc, 5)
		if s := in.idem.Stats(); s.Released != 4 || s.Panics != 1 || s.Completed != 1 {
			t.Fatalf("stats %+v", s)
		}
	}},
	{"Keys", func(t *testing.T, e storeEnv, ns string) {
		svc := &service{}
		in := startOn(t, "127.0.0.1:0", e.first, idemgrpc.Options{Namespace: ns, Methods: func(m string) bool { return m == methodCharge }}, svc)
		cc := dial(t, in.addr, nil)
		ctx := bg(t)
		for _, bad := range []string{`""`, " ", `"a", "b"`, `"unterminated`, strings.Repeat("k", 256)} {
			wantCode(t, call(ctx, cc, methodCharge, "alice", bad, "x"), codes.InvalidArgument, idemgrpc.ReasonKeyInvalid)
		}
		wantOK(t, call(ctx, cc, methodCharge, "alice", strings.Repeat("k", 255), "x"), 1, false)
		// Without a key, or on a method not covered, the call passes through.
		wantOK(t, call(ctx, cc, methodCharge, "alice", "", "x"), 2, false)
		wantOK(t, call(ctx, cc, methodCharge, "alice", "", "x"), 3, false)
		wantOK(t, call(ctx, cc, methodRefund, "alice", "k9", "x"), 4, false)
		wantOK(t, call(ctx, cc, methodRefund, "alice", "k9", "x"), 5, false)
		wantExecuted(t, svc, 5)

		req := &service{}
		rin := startOn(t, "127.0.0.1:0", e.first, idemgrpc.Options{Namespace: ns + "-req", RequireKey: true}, req)
		rcc := dial(t, rin.addr, nil)
		wantCode(t, call(ctx, rcc, methodCharge, "alice", "", "x"), codes.InvalidArgument, idemgrpc.ReasonKeyMissing)
		wantExecuted(t, req, 0)
	}},
	{"Scope", func(t *testing.T, e storeEnv, ns string) {
		svc := &service{}
		in := startOn(t, "127.0.0.1:0", e.first, idemgrpc.Options{Namespace: ns}, svc)
		cc := dial(t, in.addr, nil)
		ctx := bg(t)
		wantCode(t, call(ctx, cc, methodCharge, "", "k1", "x"), codes.Unauthenticated, idemgrpc.ReasonScopeMissing)
		wantExecuted(t, svc, 0)
		wantOK(t, call(ctx, cc, methodCharge, "alice", "k1", "x"), 1, false)
		wantOK(t, call(ctx, cc, methodCharge, "bob", "k1", "x"), 2, false)
		wantOK(t, call(ctx, cc, methodCharge, "alice", "k1", "x"), 1, true)
		wantOK(t, call(ctx, cc, methodCharge, "bob", "k1", "x"), 2, true)
		wantExecuted(t, svc, 2)
	}},
	{"StoreDown", func(t *testing.T, e storeEnv, ns string) {
		fs := &faultStore{LeaseStore: e.first}
		fs.down.Store(true)
		svc := &service{}
		in := startOn(t, "127.0.0.1:0", fs, idemgrpc.Options{Namespace: ns, UnavailableRetryAfter: 3 * time.Second, Logger: quietLogger()}, svc)
		cc := dial(t, in.addr, nil)
		ctx := bg(t)
		r := call(ctx, cc, methodCharge, "alice", "k1", "x")
		wantCode(t, r, codes.Unavailable, idemgrpc.ReasonUnavailable)
		if d, ok := idemgrpc.RetryDelay(r.err); !ok || d != 3*time.Second {
			t.Fatalf("RetryInfo %v %v, want 3s", d, ok)
		}
		wantExecuted(t, svc, 0)
		fs.down.Store(false)
		wantOK(t, call(ctx, cc, methodCharge, "alice", "k1", "x"), 1, false)

		fs.down.Store(true)
		open := startOn(t, "127.0.0.1:0", fs, idemgrpc.Options{Namespace: ns, FailOpen: true, Logger: quietLogger()}, svc)
		wantOK(t, call(ctx, dial(t, open.addr, nil), methodCharge, "alice", "k1", "x"), 2, false)
		if s := open.idem.Stats(); s.FailOpen != 1 {
			t.Fatalf("stats %+v", s)
		}
	}},
	{"ConcurrentTwoInstances", func(t *testing.T, e storeEnv, ns string) {
		// 20 identical calls at once, split across two servers sharing the
		// store: one runs, the others are told it is in progress.
		g := newGate(t)
		svc := &service{h: func(_ context.Context, m string, n int64, req *wrapperspb.StringValue) (*structpb.Struct, error) {
			g.wait()
			return okReply(m, n, req)
		}}
		a := startOn(t, "127.0.0.1:0", e.first, idemgrpc.Options{Namespace: ns}, svc)
		b := startOn(t, "127.0.0.1:0", e.second, idemgrpc.Options{Namespace: ns}, svc)
		ccs := []*grpc.ClientConn{dial(t, a.addr, nil), dial(t, b.addr, nil)}
		ctx := bg(t)
		results := make(chan result, 20)
		for i := range 20 {
			go func() { results <- call(ctx, ccs[i%2], methodCharge, "alice", "k1", "10 EUR") }()
		}
		var ok []result
		for range 19 {
			r := <-results
			if r.err == nil {
				ok = append(ok, r)
				continue
			}
			wantCode(t, r, codes.Aborted, idemgrpc.ReasonInProgress)
		}
		g.open()
		ok = append(ok, <-results)
		if len(ok) != 1 {
			t.Fatalf("%d calls succeeded while the first was held: want 1", len(ok))
		}
		wantOK(t, ok[0], 1, false)
		wantExecuted(t, svc, 1)
		wantOK(t, call(ctx, ccs[1], methodCharge, "alice", "k1", "10 EUR"), 1, true)
	}},
	{"Wait", func(t *testing.T, e storeEnv, ns string) {
		// Options.Wait: duplicates wait for the first call and replay it.
		g := newGate(t)
		svc := &service{h: func(_ context.Context, m string, n int64, req *wrapperspb.StringValue) (*structpb.Struct, error) {
			g.wait()
			return okReply(m, n, req)
		}}
		in := startOn(t, "127.0.0.1:0", e.first, idemgrpc.Options{Namespace: ns, Wait: time.Minute}, svc)
		cc := dial(t, in.addr, nil)
		ctx := bg(t)
		results := make(chan result, 5)
		go func() { results <- call(ctx, cc, methodCharge, "alice", "k1", "x") }()
		g.reached(t)
		for range 4 {
			go func() { results <- call(ctx, cc, methodCharge, "alice", "k1", "x") }()
		}
		testenv.Eventually(t, time.Minute, "4 duplicates waiting", func() bool { return in.idem.Stats().Waited == 4 }, nil)
		g.open()
		replayed := 0
		for range 5 {
			r := <-results
			wantOK(t, r, 1, r.replayed())
			if r.replayed() {
				replayed++
			}
		}
		if replayed != 4 {
			t.Fatalf("%d replays, want 4", replayed)
		}
		wantExecuted(t, svc, 1)
	}},
	{"LeaseRenewed", func(t *testing.T, e storeEnv, ns string) {
		// A handler that outlives its lease keeps the key: renewals.
		g := newGate(t)
		svc := &service{h: func(_ context.Context, m string, n int64, req *wrapperspb.StringValue) (*structpb.Struct, error) {
			g.wait()
			return okReply(m, n, req)
		}}
		renewed := renewalSignal(make(chan struct{}, 16))
		in := startOn(t, "127.0.0.1:0", e.first, idemgrpc.Options{Namespace: ns, Lease: testLease, Hooks: []idem.Hook{renewed}}, svc)
		other := startOn(t, "127.0.0.1:0", e.second, idemgrpc.Options{Namespace: ns, Lease: testLease}, svc)
		ctx := bg(t)
		first := make(chan result, 1)
		go func() { first <- call(ctx, dial(t, in.addr, nil), methodCharge, "alice", "k1", "x") }()
		g.reached(t)
		// The lease would have run out twice without renewals: they come
		// at most every Lease/3, so 7 of them span more than two leases.
		for i := range 7 {
			select {
			case <-renewed:
			case <-time.After(10 * testLease):
				t.Fatalf("%d renewals in %v, want 7", i, 10*testLease)
			}
		}
		wantCode(t, call(ctx, dial(t, other.addr, nil), methodCharge, "alice", "k1", "x"), codes.Aborted, idemgrpc.ReasonInProgress)
		g.open()
		wantOK(t, <-first, 1, false)
		wantExecuted(t, svc, 1)
	}},
	{"CorruptRecord", func(t *testing.T, e storeEnv, ns string) {
		// A stored result that cannot be decoded is never treated as
		// absent: INTERNAL, and the handler does not run.
		svc := &service{}
		in := startOn(t, "127.0.0.1:0", e.first, idemgrpc.Options{Namespace: ns, Logger: quietLogger()}, svc)
		cc := dial(t, in.addr, nil)
		ctx := bg(t)
		wantOK(t, call(ctx, cc, methodCharge, "alice", "k1", "x"), 1, false)
		fp, err := idemgrpc.Fingerprint(methodCharge, wrapperspb.String("x"))
		if err != nil {
			t.Fatal(err)
		}
		id := in.idem.RecordID("alice", "k2")
		ar, err := e.first.Acquire(ctx, &idemdriver.AcquireParams{Consumer: in.idem.Consumer(), MessageID: id, Fingerprint: fp, Lease: time.Minute})
		if err != nil || !ar.Acquired {
			t.Fatalf("acquire: %+v %v", ar, err)
		}
		if err := e.first.Complete(ctx, &idemdriver.CompleteParams{Consumer: in.idem.Consumer(), MessageID: id, Token: ar.Token, Result: []byte("garbage"), ContentType: "text/plain"}); err != nil {
			t.Fatal(err)
		}
		wantCode(t, call(ctx, cc, methodCharge, "alice", "k2", "x"), codes.Internal, idemgrpc.ReasonRecordCorrupt)
		wantExecuted(t, svc, 1)
	}},
	{"CompleteFails", func(t *testing.T, e storeEnv, ns string) {
		// The final write fails until the lease is lost: the caller is
		// told the result is not recorded, and a retry after the lease ran
		// out runs the handler again (at least once).
		fs := &faultStore{LeaseStore: e.first}
		fs.failComplete.Store(true)
		svc := &service{}
		opts := idemgrpc.Options{Namespace: ns, Lease: testLease, InProgressRetryAfter: 200 * time.Millisecond, Logger: quietLogger()}
		in := startOn(t, "127.0.0.1:0", fs, opts, svc)
		ctx := bg(t)
		r := call(ctx, dial(t, in.addr, nil), methodCharge, "alice", "k1", "x")
		wantCode(t, r, codes.Unavailable, idemgrpc.ReasonNotRecorded)
		fs.failComplete.Store(false)
		cc := dial(t, in.addr, &idemgrpc.ClientOptions{MaxAttempts: 1000, MaxElapsed: 10 * testLease})
		wantOK(t, call(ctx, cc, methodCharge, "alice", "k1", "x"), 2, false)
		wantExecuted(t, svc, 2)
	}},
	{"CrashRunsAgain", func(t *testing.T, e storeEnv, ns string) {
		testCrash(t, e, ns, idemgrpc.Options{})
	}},
	{"CrashAtMostOnce", func(t *testing.T, e storeEnv, ns string) {
		testCrash(t, e, ns, idemgrpc.Options{AfterCrash: idemhttp.AnswerUnknownAfterCrash})
	}},
}

// testCrash: a server's handler never returns, and the server dies (its
// store handle fails every renewal and final write, and it stops serving);
// a new server on the same address and store takes over. The client's
// retry with the same key gets request-in-progress until the lease runs
// out, retrying after the server's hint; then the call runs again
// (RunAgainAfterCrash), or the stored outcome-unknown answer is given and
// never run again (AnswerUnknownAfterCrash).
func testCrash(t *testing.T, e storeEnv, ns string, opts idemgrpc.Options) {
	g := newGate(t)
	svc := &service{h: func(_ context.Context, m string, n int64, req *wrapperspb.StringValue) (*structpb.Struct, error) {
		if n == 1 {
			g.wait()
		}
		return okReply(m, n, req)
	}}
	opts.Namespace, opts.Lease, opts.Logger = ns, testLease, quietLogger()
	opts.InProgressRetryAfter = 200 * time.Millisecond
	fs := &faultStore{LeaseStore: e.first}
	crashed := startOn(t, "127.0.0.1:0", fs, opts, svc)
	ctx := bg(t)
	first := make(chan result, 1)
	go func() { first <- call(ctx, dial(t, crashed.addr, nil), methodCharge, "alice", "k1", "10 EUR") }()
	g.reached(t)
	fs.dead.Store(true)
	crashed.gs.Stop()
	if r := <-first; status.Code(r.err) != codes.Unavailable {
		t.Fatalf("call to the crashed server: %v, want UNAVAILABLE", r.err)
	}

	restarted := startOn(t, crashed.addr, e.second, opts, svc)
	var retries []error
	cc := dial(t, restarted.addr, &idemgrpc.ClientOptions{
		MaxAttempts: 1000, MaxElapsed: 10 * testLease,
		OnRetry: func(_ string, _ int, err error, wait time.Duration) {
			retries = append(retries, err)
			if idemgrpc.Reason(err) == idemgrpc.ReasonInProgress && wait != 200*time.Millisecond {
				t.Errorf("retry wait %v, want the server's 200ms", wait)
			}
		},
	})
	// The client's own key, set by the caller: the same as the crashed call's.
	r := call(ctx, cc, methodCharge, "alice", "k1", "10 EUR")
	if len(retries) == 0 || idemgrpc.Reason(retries[0]) != idemgrpc.ReasonInProgress {
		t.Fatalf("retries %v: want request-in-progress while the dead attempt's lease lasted", retries)
	}
	if opts.AfterCrash == idemhttp.RunAgainAfterCrash {
		wantOK(t, r, 2, false)
		wantOK(t, call(ctx, cc, methodCharge, "alice", "k1", "10 EUR"), 2, true)
		wantExecuted(t, svc, 2)
		return
	}
	wantCode(t, r, codes.Unknown, idemgrpc.ReasonOutcomeUnknown)
	rr := call(ctx, cc, methodCharge, "alice", "k1", "10 EUR")
	wantCode(t, rr, codes.Unknown, idemgrpc.ReasonOutcomeUnknown)
	if !rr.replayed() {
		t.Fatal("outcome-unknown not replayed")
	}
	wantExecuted(t, svc, 1)
	if s := restarted.idem.Stats(); s.Unknown != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// recoverPanics is a recovery interceptor: a panic becomes INTERNAL.
func recoverPanics(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if v := recover(); v != nil {
			resp, err = nil, status.Errorf(codes.Internal, "panic: %v", v)
		}
	}()
	return h(ctx, req)
}

// renewalSignal is a hook that sends a value per lease renewal (dropped
// when the channel is full).
type renewalSignal chan struct{}

func (r renewalSignal) OnLeaseRenewed(context.Context, idem.LeaseEvent) {
	select {
	case r <- struct{}{}:
	default:
	}
}

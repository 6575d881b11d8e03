package idemgrpc_test

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemgrpc"
)

// A gRPC server whose Charge method runs once per idempotency key, on the
// memory store (use store/idemsql, store/idempgxv5 or store/idemredis to
// share keys between replicas), and a client that sends one key per call.
func ExampleServer() {
	store := idem.NewMemoryStore(nil)
	keys, err := idemgrpc.New(store, idemgrpc.Options{
		Namespace: "payments",
		// The caller's identity, as your authentication interceptor
		// established it; here, a metadata entry.
		Scope: func(ctx context.Context) (string, error) {
			md, _ := metadata.FromIncomingContext(ctx)
			if v := md.Get("account"); len(v) == 1 {
				return v[0], nil
			}
			if p, ok := peer.FromContext(ctx); ok && p.AuthInfo != nil {
				return p.AuthInfo.AuthType(), nil
			}
			return "", nil // UNAUTHENTICATED
		},
	})
	if err != nil {
		panic(err)
	}
	defer keys.Close()

	charges := 0
	charge := func(_ context.Context, amount *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		charges++ // the side effect that must happen once
		return wrapperspb.String("charged " + amount.GetValue()), nil
	}
	gs := grpc.NewServer(grpc.UnaryInterceptor(keys.UnaryServerInterceptor()))
	gs.RegisterService(&paymentsDesc, charge)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go gs.Serve(lis)
	defer gs.Stop()

	retry, err := idemgrpc.NewClientInterceptor(nil)
	if err != nil {
		panic(err)
	}
	cc, err := grpc.NewClient(lis.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithUnaryInterceptor(retry))
	if err != nil {
		panic(err)
	}
	defer cc.Close()

	// The same logical charge sent twice (a retry by the application
	// after a timeout, say) with the caller's own key.
	ctx := metadata.AppendToOutgoingContext(context.Background(), "account", "acct_1")
	ctx = idemgrpc.ContextWithKey(ctx, "charge-order-42")
	for range 2 {
		var reply wrapperspb.StringValue
		var header metadata.MD
		err := cc.Invoke(ctx, "/example.Payments/Charge", wrapperspb.String("10 EUR"), &reply, grpc.Header(&header))
		fmt.Println(err, reply.GetValue(), "replayed:", header.Get(idemgrpc.MetadataReplayed))
	}
	fmt.Println("charges:", charges)
	// Output:
	// <nil> charged 10 EUR replayed: []
	// <nil> charged 10 EUR replayed: [true]
	// charges: 1
}

// paymentsDesc registers a one-method service by hand (generated code
// does this for a .proto service): example.Payments/Charge takes and
// answers a google.protobuf.StringValue; the registered implementation is
// the charge function itself.
var paymentsDesc = grpc.ServiceDesc{
	ServiceName: "example.Payments",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Charge",
		Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.StringValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			charge := srv.(func(context.Context, *wrapperspb.StringValue) (*wrapperspb.StringValue, error))
			h := func(ctx context.Context, req any) (any, error) { return charge(ctx, req.(*wrapperspb.StringValue)) }
			if ic == nil { // a server without interceptors
				return h(ctx, in)
			}
			return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/example.Payments/Charge"}, h)
		},
	}},
}

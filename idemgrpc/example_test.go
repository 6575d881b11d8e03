package idemgrpc_test

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/types/known/structpb"
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
	svc := &service{h: func(_ context.Context, method string, n int64, req *wrapperspb.StringValue) (*structpb.Struct, error) {
		charges++ // the side effect that must happen once
		return okReply(method, n, req)
	}}
	gs := grpc.NewServer(grpc.UnaryInterceptor(keys.UnaryServerInterceptor()))
	gs.RegisterService(&serviceDesc, svc)
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
		var reply structpb.Struct
		var header metadata.MD
		err := cc.Invoke(ctx, methodCharge, wrapperspb.String("10 EUR"), &reply, grpc.Header(&header))
		fmt.Println(err, reply.GetFields()["value"].GetStringValue(), "replayed:", header.Get(idemgrpc.MetadataReplayed))
	}
	fmt.Println("charges:", charges)
	// Output:
	// <nil> 10 EUR replayed: []
	// <nil> 10 EUR replayed: [true]
	// charges: 1
}

package grpctest

import (
	"fmt"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemgrpc"
)

// BenchmarkCall measures one unary call over loopback on the memory store:
// without a key (pass-through), with a new key each call (claim, run,
// record) and with the same key (replay).
func BenchmarkCall(b *testing.B) {
	for _, mode := range []string{"no-key", "new-key", "replay"} {
		b.Run(mode, func(b *testing.B) {
			svc := &service{}
			in := startOn(b, "127.0.0.1:0", idem.NewMemoryStore(nil), idemgrpc.Options{}, svc)
			cc := dial(b, in.addr, nil)
			ctx := b.Context()
			b.ResetTimer()
			for i := range b.N {
				key := ""
				switch mode {
				case "new-key":
					key = fmt.Sprint("k", i)
				case "replay":
					key = "k"
				}
				if r := call(ctx, cc, methodCharge, "alice", key, "x"); r.err != nil {
					b.Fatal(r.err)
				}
			}
		})
	}
}

package idem_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/leasebatch"
)

// BenchmarkLeaseProcess is one new message through LeaseConsumer.Process
// on the memory store, with the default store timeout: the lease engine's
// CPU and allocations per message, its store calls (Acquire and the final
// Complete) made on their bounded contexts. Sub-benchmark "leasebatch"
// sends them through internal/leasebatch, as `idem consume` does (one
// caller: each call alone).
//
//	go test -run '^$' -bench BenchmarkLeaseProcess -benchmem
func BenchmarkLeaseProcess(b *testing.B) {
	b.Run("memory", func(b *testing.B) { benchmarkLeaseProcess(b, idem.NewMemoryStore(nil)) })
	b.Run("leasebatch", func(b *testing.B) { benchmarkLeaseProcess(b, leasebatch.New(idem.NewMemoryStore(nil), 64)) })
}

func benchmarkLeaseProcess(b *testing.B, store idemdriver.LeaseStore) {
	c, err := idem.NewLeaseConsumer(store, idem.Config{Name: "bench", Lease: 30 * time.Second, PurgeInterval: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	ctx := context.Background()
	payload := []byte(`{"order":1,"amount":1000}`)
	h := func(context.Context, *idem.Attempt) (idem.Result, error) { return idem.Result{Body: payload}, nil }
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		out, err := c.Process(ctx, idem.Message{ID: "m" + strconv.Itoa(i), Payload: payload}, h)
		if err != nil || out.Status != idem.Processed {
			b.Fatalf("%v %v", out.Status, err)
		}
	}
}

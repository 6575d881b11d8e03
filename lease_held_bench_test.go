package idem_test

import (
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest"
)

// BenchmarkHeldAttempts holds 10,000 lease-mode attempts at once on the
// memory store for one lease (3s) and reports the goroutines, the live
// heap per attempt (the store's records included) and the renewals
// (idemtest.BenchmarkHeldAttempts):
//
//	go test -run '^$' -bench BenchmarkHeldAttempts -benchtime 1x
func BenchmarkHeldAttempts(b *testing.B) {
	idemtest.BenchmarkHeldAttempts(b, idem.NewMemoryStore(nil), "bench-held", 10000, 3*time.Second, 3*time.Second)
}

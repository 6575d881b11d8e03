package idem_test

import (
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest"
)

// BenchmarkLeaseRoundTrips reports lease mode's store calls per message
// on the memory store, with its StepRecorder capability and without it
// (idemtest.BenchmarkRoundTrips):
//
//	go test -run '^$' -bench BenchmarkLeaseRoundTrips -benchtime 20x
func BenchmarkLeaseRoundTrips(b *testing.B) {
	idemtest.BenchmarkRoundTrips(b, idem.NewMemoryStore(nil), "bench-rt")
}

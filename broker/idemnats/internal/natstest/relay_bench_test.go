package natstest

import (
	"strconv"
	"testing"
	"time"

	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/broker/idemnats"
)

// BenchmarkRelay measures the outbox relay sending through NewPublisher
// to an in-process JetStream server (file storage, a two-minute duplicate
// window), from a memory store (brokertest.RelayBench): batches of 100,
// with 1 and 4 rounds in flight. Run:
//
//	cat /proc/loadavg; go test -run '^$' -bench BenchmarkRelay -benchtime 100000x -count 5
func BenchmarkRelay(b *testing.B) {
	for _, workers := range []int{1, 4} {
		b.Run("workers"+strconv.Itoa(workers), func(b *testing.B) {
			_, js := newJS(b, inProcess(b))
			s := newStreams(b, js, 2*time.Minute)
			brokertest.RelayBench(b, idemnats.NewPublisher(js), s.subject, 100, workers)
		})
	}
}

package brokertest

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// RelayBench measures a relay publisher's sending throughput: b.N
// outgoing messages (about 100-byte payloads, ordering keys spread over
// 1,000 values) are written to a memory store's outbox, then an
// idem.Relay with batches of batchSize and workers rounds in flight sends
// them all through pub to destination, and the benchmark reports msgs/s
// (sent and marked). The memory store keeps the database out of the
// figure: what is measured is the relay's rounds (claim, publish, mark)
// and the publisher against its broker. It fails if a message is not
// sent.
func RelayBench(b *testing.B, pub idem.Publisher, destination string, batchSize, workers int) {
	b.Helper()
	ctx := context.Background()
	store := idem.NewMemoryStore(nil)
	payload := []byte(`{"order":"o-0000000","amount":200,"currency":"EUR","note":"relay throughput benchmark......"}`)
	const perTx = 1000
	for done := 0; done < b.N; done += perTx {
		rows := make([]idemdriver.OutgoingRecord, min(perTx, b.N-done))
		for i := range rows {
			n := strconv.Itoa(done + i)
			rows[i] = idemdriver.OutgoingRecord{ID: "out-" + n, Destination: destination, Key: "k" + strconv.Itoa((done+i)%1000), Payload: payload}
		}
		tx, err := store.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := store.EmitTx(ctx, tx, &idemdriver.EmitParams{Consumer: "bench", Messages: rows}); err != nil {
			b.Fatal(err)
		}
		if err := store.Commit(ctx, tx); err != nil {
			b.Fatal(err)
		}
	}
	r, err := idem.NewRelay(idem.RelayConfig{Store: store, Publisher: pub, BatchSize: batchSize, Workers: workers})
	if err != nil {
		b.Fatal(err)
	}
	var (
		sent atomic.Int64
		wg   sync.WaitGroup
	)
	b.ResetTimer()
	for range workers {
		wg.Go(func() {
			for sent.Load() < int64(b.N) {
				res, err := r.RunOnce(ctx)
				if err != nil {
					b.Error(err)
					return
				}
				if res.Retried > 0 || res.Failed > 0 {
					b.Errorf("relay round: %+v", res)
					return
				}
				if res.Claimed == 0 {
					return
				}
				sent.Add(int64(res.Sent))
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if got := sent.Load(); got != int64(b.N) {
		b.Fatalf("sent %d of %d", got, b.N)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

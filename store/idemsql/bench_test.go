package idemsql_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/store/idemsql"
)

// benchParallelism multiplies GOMAXPROCS into the number of goroutines
// each benchmark runs, so the server sees concurrent transactions even on
// a small machine.
const benchParallelism = 4

// BenchmarkStore measures, per dialect (SQLite always, PostgreSQL when
// IDEM_TEST_POSTGRES_URL is set), four ways of handling a message whose
// side effect is one INSERT into an effects table:
//
//   - naive: a transaction that writes only the side effect (no idempotency);
//   - idem: Consumer.Process of a new message writing the same row;
//   - idem_batch100: Consumer.ProcessBatch of 100 new messages, whose
//     handler writes the 100 rows with one multi-row INSERT (one op is one
//     batch; ns/msg and msgs/s are per message);
//   - duplicate: Consumer.Process of a message already processed.
//
// Every case reports msgs/s. Run with:
//
//	go test -run '^$' -bench BenchmarkStore -benchtime 3s
func BenchmarkStore(b *testing.B) {
	for _, d := range []idemsql.Dialect{idemsql.SQLite, idemsql.Postgres} {
		b.Run(string(d), func(b *testing.B) {
			e := newEnv(b, d, envOptions{})
			c, err := idem.NewConsumer[*sql.Tx](e.store, idem.Config{Name: "bench", PurgeInterval: -1})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { c.Close() })
			var seq atomic.Int64
			next := func() string { return fmt.Sprintf("m-%d", seq.Add(1)) }
			ctx := context.Background()
			payload := []byte(`{"amount_cents":1250,"currency":"EUR"}`)

			b.Run("naive", func(b *testing.B) {
				b.SetParallelism(benchParallelism)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						tx, err := e.db.BeginTx(ctx, nil)
						if err != nil {
							b.Error(err)
							return
						}
						if err := e.writeEffect(ctx, tx, next()); err != nil {
							tx.Rollback()
							b.Error(err)
							return
						}
						if err := tx.Commit(); err != nil {
							b.Error(err)
							return
						}
					}
				})
				reportRate(b, 1)
			})

			b.Run("idem", func(b *testing.B) {
				b.SetParallelism(benchParallelism)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						out, err := c.Process(ctx, idem.Message{ID: next(), Payload: payload}, e.effectHandler)
						if err != nil || out.Status != idem.Processed {
							b.Errorf("Process: %v, %v", out.Status, err)
							return
						}
					}
				})
				reportRate(b, 1)
			})

			b.Run("idem_batch100", func(b *testing.B) {
				b.SetParallelism(benchParallelism)
				b.RunParallel(func(pb *testing.PB) {
					batch := make([]idem.Message, 100)
					for pb.Next() {
						for i := range batch {
							batch[i] = idem.Message{ID: next(), Payload: payload}
						}
						_, err := c.ProcessBatch(ctx, batch, func(ctx context.Context, tx *sql.Tx, msgs []idem.Message) error {
							keys := make([]string, len(msgs))
							for i, m := range msgs {
								keys[i] = m.ID
							}
							return e.writeEffects(ctx, tx, keys)
						})
						if err != nil {
							b.Errorf("ProcessBatch: %v", err)
							return
						}
					}
				})
				reportRate(b, 100)
			})

			b.Run("duplicate", func(b *testing.B) {
				const pool = 1000
				ids := make([]string, pool)
				for i := range ids {
					ids[i] = next()
					if _, err := c.Process(ctx, idem.Message{ID: ids[i], Payload: payload}, e.effectHandler); err != nil {
						b.Fatal(err)
					}
				}
				var k atomic.Int64
				b.ResetTimer()
				b.SetParallelism(benchParallelism)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						id := ids[k.Add(1)%pool]
						out, err := c.Process(ctx, idem.Message{ID: id, Payload: payload}, e.effectHandler)
						if err != nil || out.Status != idem.Duplicate {
							b.Errorf("Process: %v, %v", out.Status, err)
							return
						}
					}
				})
				reportRate(b, 1)
			})
		})
	}
}

// reportRate reports messages per second and, for batches, ns per message.
func reportRate(b *testing.B, perOp int) {
	msgs := float64(b.N) * float64(perOp)
	if sec := b.Elapsed().Seconds(); sec > 0 {
		b.ReportMetric(msgs/sec, "msgs/s")
	}
	if perOp > 1 {
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/msgs, "ns/msg")
	}
}

// BenchmarkLeaseRoundTrips reports, per dialect (SQLite always,
// PostgreSQL and MySQL/MariaDB when their URLs are set), lease mode's
// store calls per message (new, duplicate, release) with the store's
// StepRecorder capability and without it, and the time of a new message
// (idemtest.BenchmarkRoundTrips):
//
//	go test -run '^$' -bench BenchmarkLeaseRoundTrips -benchtime 20x
func BenchmarkLeaseRoundTrips(b *testing.B) {
	for _, d := range []idemsql.Dialect{idemsql.SQLite, idemsql.Postgres, idemsql.MySQL} {
		b.Run(string(d), func(b *testing.B) {
			idemtest.BenchmarkRoundTrips(b, newEnv(b, d, envOptions{}).store, "bench-rt")
		})
	}
}

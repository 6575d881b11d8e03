package idempgxv5_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/jackc/pgx/v5"
)

// benchWorkers is the concurrency of every benchmark: that many goroutines
// share a pool of as many connections. 8 unless IDEM_BENCH_WORKERS says
// otherwise (1 shows the latency-bound case).
var benchWorkers = func() int {
	if n, err := strconv.Atoi(os.Getenv("IDEM_BENCH_WORKERS")); err == nil && n > 0 {
		return n
	}
	return 8
}()

var benchSeq atomic.Int64

// benchPrefix makes message IDs unique across the runs of a benchmark.
func benchPrefix() string {
	return "b" + strconv.FormatInt(benchSeq.Add(1), 10) + "-"
}

// steady seeds the bundle's tables with 100,000 rows each (records of
// another consumer, effect rows) and analyzes them, so that a benchmark
// measures a table in its steady state: with history, and with statistics
// and cached plans that match its size. (A table analyzed while nearly
// empty keeps cheap-looking sequential-scan plans for its lookups until
// autovacuum analyzes it again.)
func steady(b *testing.B, bb *bundle) {
	b.Helper()
	ctx := context.Background()
	for _, q := range []string{
		`INSERT INTO ` + bb.table + ` (consumer, message_id, fingerprint)
			SELECT 'history', 'h-' || g, sha256(g::text::bytea) FROM generate_series(1, 100000) g`,
		`INSERT INTO ` + bb.effects + ` (key) SELECT 'h-' || g FROM generate_series(1, 100000) g`,
		`ANALYZE ` + bb.table + `, ` + bb.effects,
	} {
		if _, err := bb.pool.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
}

// runWorkers runs op b.N times across benchWorkers goroutines and reports
// the throughput in messages per second (msgsPerOp messages per op) and,
// where it can be measured, the CPU time per message (see cpuMeter).
func runWorkers(b *testing.B, bb *bundle, msgsPerOp int, op func(ctx context.Context, i int64) error) {
	b.Helper()
	ctx := context.Background()
	steady(b, bb)
	m := startCPU(b, bb.pool)
	var (
		next    atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		opErr   error
	)
	b.ResetTimer()
	start := time.Now()
	for range benchWorkers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				if err := op(ctx, i); err != nil {
					errOnce.Do(func() { opErr = err })
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if opErr != nil {
		b.Fatal(opErr)
	}
	b.ReportMetric(float64(b.N*msgsPerOp)/elapsed.Seconds(), "msgs/s")
	m.report(b, b.N*msgsPerOp)
}

// BenchmarkProcess compares, on one PostgreSQL, with benchWorkers workers
// on a pool of as many connections:
//   - naive: BEGIN; INSERT the side effect; COMMIT (pool.Begin), no dedupe;
//   - idem: Consumer.Process writing the same side effect with the
//     handler's transaction (BEGIN and the claim in one round trip);
//   - idem_batch100: ProcessBatch of 100 new messages, the side effects
//     written by one unnest INSERT (msgs/s counts messages, not batches);
//   - duplicate: Consumer.Process redelivering processed messages.
//
// Run: go test -run '^$' -bench BenchmarkProcess -benchtime 3s -count 3
func BenchmarkProcess(b *testing.B) {
	payload := []byte(`{"order":"o-1","amount":200}`)

	b.Run("naive", func(b *testing.B) {
		bb := setup(b, poolOpts{maxConns: int32(benchWorkers)})
		insert := `INSERT INTO ` + bb.effects + ` (key) VALUES ($1)`
		prefix := benchPrefix()
		runWorkers(b, bb, 1, func(ctx context.Context, i int64) error {
			tx, err := bb.pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(ctx) }()
			if _, err := tx.Exec(ctx, insert, prefix+strconv.FormatInt(i, 10)); err != nil {
				return err
			}
			return tx.Commit(ctx)
		})
	})

	b.Run("idem", func(b *testing.B) {
		bb := setup(b, poolOpts{maxConns: int32(benchWorkers)})
		processNew(b, bb, bb.consumer(b, "bench"), bb.effectHandler(), payload)
	})

	b.Run("idem_batch100", func(b *testing.B) {
		const size = 100
		bb := setup(b, poolOpts{maxConns: int32(benchWorkers)})
		c := bb.consumer(b, "bench")
		insert := `INSERT INTO ` + bb.effects + ` (key) SELECT unnest($1::text[])`
		prefix := benchPrefix()
		h := func(ctx context.Context, tx pgx.Tx, msgs []idem.Message) error {
			keys := make([]string, len(msgs))
			for i, m := range msgs {
				keys[i] = m.ID
			}
			_, err := tx.Exec(ctx, insert, keys)
			return err
		}
		runWorkers(b, bb, size, func(ctx context.Context, i int64) error {
			msgs := make([]idem.Message, size)
			for k := range msgs {
				msgs[k] = idem.Message{ID: prefix + strconv.FormatInt(i*size+int64(k), 10), Payload: payload}
			}
			outs, err := c.ProcessBatch(ctx, msgs, h)
			if err == nil && outs[size-1].Status != idem.Processed {
				err = fmt.Errorf("outcome %v", outs[size-1].Status)
			}
			return err
		})
	})

	b.Run("duplicate", func(b *testing.B) {
		const seeded = 1000
		bb := setup(b, poolOpts{maxConns: int32(benchWorkers)})
		c := bb.consumer(b, "bench")
		msgs := make([]idem.Message, seeded)
		for i := range msgs {
			msgs[i] = idem.Message{ID: "dup-" + strconv.Itoa(i), Payload: payload}
		}
		if _, err := c.ProcessBatch(context.Background(), msgs, func(context.Context, pgx.Tx, []idem.Message) error { return nil }); err != nil {
			b.Fatal(err)
		}
		h := bb.effectHandler()
		runWorkers(b, bb, 1, func(ctx context.Context, i int64) error {
			out, err := c.Process(ctx, msgs[i%seeded], h)
			if err == nil && out.Status != idem.Duplicate {
				err = fmt.Errorf("outcome %v", out.Status)
			}
			return err
		})
	})
}

// processNew runs Consumer.Process of new messages with payload and
// handler h across the benchmark's workers, each outcome Processed.
func processNew(b *testing.B, bb *bundle, c *idem.Consumer[pgx.Tx], h idem.Handler[pgx.Tx], payload []byte) {
	b.Helper()
	prefix := benchPrefix()
	runWorkers(b, bb, 1, func(ctx context.Context, i int64) error {
		out, err := c.Process(ctx, idem.Message{ID: prefix + strconv.FormatInt(i, 10), Payload: payload}, h)
		if err == nil && out.Status != idem.Processed {
			err = fmt.Errorf("outcome %v", out.Status)
		}
		return err
	})
}

package idemsql_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idemsql"
)

// BenchmarkLeaseBatchCommit measures what the two store writes of an
// `idem consume --batch-claim` batch cost, per dialect (SQLite always,
// PostgreSQL when its URL is set: the durable one's for figures to
// publish), one goroutine: an op is AcquireBatch of n new messages, each
// with a step prefix (the at-most-once claim, which saves each one's
// recovery point), then CompleteBatch of the n attempts. It reports the
// wall time of each write (claim-µs/op, complete-µs/op) and the process's
// CPU per op (cpu-µs/op: on SQLite, which runs in the process, the
// store's whole cost). n = 1 gives the fixed cost of a write (its
// transaction and commit), which n = 64 spreads over 64 messages: what
// writing batch N's completion and batch N+1's claim in one transaction
// would save is about one n = 1 write a batch. Run with:
//
//	go test -run '^$' -bench BenchmarkLeaseBatchCommit -benchtime 200x -count 5
func BenchmarkLeaseBatchCommit(b *testing.B) {
	for _, d := range []idemsql.Dialect{idemsql.SQLite, idemsql.Postgres} {
		b.Run(string(d), func(b *testing.B) {
			e := newEnv(b, d, envOptions{})
			ctx := context.Background()
			fp := []byte("0123456789abcdef0123456789abcdef")
			seq := 0
			for _, n := range []int{64, 1} {
				b.Run(fmt.Sprintf("batch-%d", n), func(b *testing.B) {
					var claim, complete time.Duration
					cpu := processCPU()
					for range b.N {
						ps := make([]*idemdriver.AcquireParams, n)
						for i := range ps {
							seq++
							ps[i] = &idemdriver.AcquireParams{Consumer: "bench", MessageID: fmt.Sprintf("m-%d", seq),
								Fingerprint: fp, Lease: time.Minute, StepPrefix: "run"}
						}
						start := time.Now()
						res, errs, err := e.store.AcquireBatch(ctx, ps)
						if err != nil {
							b.Fatal(err)
						}
						claimed := time.Now()
						cs := make([]*idemdriver.CompleteParams, n)
						for i := range cs {
							if errs[i] != nil || !res[i].Acquired {
								b.Fatalf("message %d not acquired: %v", i, errs[i])
							}
							cs[i] = &idemdriver.CompleteParams{Consumer: "bench", MessageID: ps[i].MessageID, Token: res[i].Token, Result: []byte("ok")}
						}
						cerrs, err := e.store.CompleteBatch(ctx, cs)
						if err != nil {
							b.Fatal(err)
						}
						for i, cerr := range cerrs {
							if cerr != nil {
								b.Fatalf("message %d not completed: %v", i, cerr)
							}
						}
						claim += claimed.Sub(start)
						complete += time.Since(claimed)
					}
					b.ReportMetric(float64(claim.Microseconds())/float64(b.N), "claim-µs/op")
					b.ReportMetric(float64(complete.Microseconds())/float64(b.N), "complete-µs/op")
					b.ReportMetric(float64((processCPU()-cpu).Microseconds())/float64(b.N), "cpu-µs/op")
				})
			}
		})
	}
}

package idemsql_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idemsql"
)

// BenchmarkClaimTx measures the store's own transactional path, without
// the core, one goroutine, per dialect (SQLite always, PostgreSQL and
// MySQL/MariaDB when their URLs are set): Begin, ClaimTx of a new message
// and Commit ("new"), and Begin, ClaimTx of a committed message and
// Rollback ("duplicate"). Its allocations per op are the store's and the
// driver's; on SQLite, which runs in the process, ns/op is CPU. Run with:
//
//	go test -run '^$' -bench BenchmarkClaimTx -benchmem -benchtime 2000x
func BenchmarkClaimTx(b *testing.B) {
	type target struct {
		name string
		d    idemsql.Dialect
		o    envOptions
	}
	targets := []target{{"sqlite", idemsql.SQLite, envOptions{}}, {"postgres", idemsql.Postgres, envOptions{}},
		{"mysql", idemsql.MySQL, envOptions{}}}
	for _, tg := range targets {
		b.Run(tg.name, func(b *testing.B) {
			e := newEnv(b, tg.d, tg.o)
			ctx := context.Background()
			fp := []byte("0123456789abcdef0123456789abcdef")
			claim := func(id string) idemdriver.ClaimResult {
				tx, err := e.store.Begin(ctx)
				if err != nil {
					b.Fatal(err)
				}
				res, err := e.store.ClaimTx(ctx, tx, &idemdriver.ClaimParams{Consumer: "bench", MessageID: id, Fingerprint: fp})
				if err != nil {
					b.Fatal(err)
				}
				if res.Claimed {
					err = e.store.Commit(ctx, tx)
				} else {
					err = e.store.Rollback(ctx, tx)
				}
				if err != nil {
					b.Fatal(err)
				}
				return res
			}
			ids := make([]string, 0, 1<<16)
			b.Run("new", func(b *testing.B) {
				b.ReportAllocs()
				for i := range b.N {
					ids = append(ids, fmt.Sprintf("m-%d-%d", len(ids), i))
				}
				b.ResetTimer()
				cpu := processCPU()
				for _, id := range ids[len(ids)-b.N:] {
					if !claim(id).Claimed {
						b.Fatalf("%s: not claimed", id)
					}
				}
				reportCPU(b, cpu)
			})
			b.Run("duplicate", func(b *testing.B) {
				if len(ids) == 0 {
					ids = append(ids, "m-dup")
					claim(ids[0])
				}
				b.ReportAllocs()
				b.ResetTimer()
				cpu := processCPU()
				for i := range b.N {
					if res := claim(ids[i%len(ids)]); res.Claimed {
						b.Fatalf("%s: claimed again", ids[i%len(ids)])
					}
				}
				reportCPU(b, cpu)
			})
		})
	}
}

// reportCPU reports the process's CPU time since start per op, in µs.
func reportCPU(b *testing.B, start time.Duration) {
	if used := processCPU() - start; used > 0 && b.N > 0 {
		b.ReportMetric(float64(used.Microseconds())/float64(b.N), "cpu-µs/op")
	}
}

// BenchmarkClaimBatchTx measures the store's PostgreSQL batch claim alone,
// one goroutine: Begin, ClaimBatchTx of 100 new messages and Commit per
// op, through pgx's stdlib ("native": the arrays as text[] and bytea[]
// parameters) and through the same driver unrecognised ("text": array
// literals with hex fingerprints, the path of any other driver). Run
// with -count to alternate the two:
//
//	go test -run '^$' -bench BenchmarkClaimBatchTx -benchmem -benchtime 300x -count 5
func BenchmarkClaimBatchTx(b *testing.B) {
	const size = 100
	for _, tg := range []struct {
		name string
		o    envOptions
	}{{"native", envOptions{}}, {"text", envOptions{pgWrapped: true}}} {
		b.Run(tg.name, func(b *testing.B) {
			e := newEnv(b, idemsql.Postgres, tg.o)
			ctx := context.Background()
			batches := make([]*idemdriver.ClaimBatchParams, b.N)
			for i := range batches {
				p := &idemdriver.ClaimBatchParams{Consumer: "bench", Messages: make([]idemdriver.ClaimMessage, size)}
				for j := range p.Messages {
					p.Messages[j] = idemdriver.ClaimMessage{MessageID: fmt.Sprintf("b-%06d-%03d", i, j), Fingerprint: []byte("0123456789abcdef0123456789abcdef")}
				}
				batches[i] = p
			}
			b.ReportAllocs()
			b.ResetTimer()
			cpu := processCPU()
			for _, p := range batches {
				tx, err := e.store.Begin(ctx)
				if err != nil {
					b.Fatal(err)
				}
				res, err := e.store.ClaimBatchTx(ctx, tx, p)
				if err != nil {
					b.Fatal(err)
				}
				if len(res) != size || !res[0].Claimed || !res[size-1].Claimed {
					b.Fatalf("batch of %d new messages: %d results, first claimed %v", size, len(res), len(res) > 0 && res[0].Claimed)
				}
				if err := e.store.Commit(ctx, tx); err != nil {
					b.Fatal(err)
				}
			}
			reportCPU(b, cpu)
		})
	}
}

package idempgxv5_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
)

// leaseBatchSize is the batch of BenchmarkLeaseBatch and
// TestLeaseBatchServerInstructions: idem consume's --store-batch 64.
const leaseBatchSize = 64

// leaseBatchOp is one operation of the lease batch measurements on s:
// AcquireBatch of leaseBatchSize new messages (IDs prefix + i*size + k),
// each acquired, then CompleteBatch of them with a result, each
// completed.
func leaseBatchOp(ctx context.Context, s idemdriver.LeaseBatcher, prefix string, i int64) error {
	cps, err := leaseBatchAcquire(ctx, s, prefix, i)
	if err != nil {
		return err
	}
	return leaseBatchComplete(ctx, s, cps)
}

// leaseBatchAcquire is the AcquireBatch of leaseBatchOp; it returns the
// completions of the messages it acquired.
func leaseBatchAcquire(ctx context.Context, s idemdriver.LeaseBatcher, prefix string, i int64) ([]*idemdriver.CompleteParams, error) {
	ps := make([]*idemdriver.AcquireParams, leaseBatchSize)
	sum := fp("payload")
	for k := range ps {
		ps[k] = &idemdriver.AcquireParams{Consumer: "bench", MessageID: prefix + strconv.FormatInt(i*leaseBatchSize+int64(k), 10), Fingerprint: sum, Lease: time.Minute}
	}
	res, errs, err := s.AcquireBatch(ctx, ps)
	if err != nil {
		return nil, err
	}
	cps := make([]*idemdriver.CompleteParams, leaseBatchSize)
	for k, r := range res {
		if errs[k] != nil || !r.Acquired {
			return nil, fmt.Errorf("acquire %s: %+v, %v", ps[k].MessageID, r, errs[k])
		}
		cps[k] = &idemdriver.CompleteParams{Consumer: "bench", MessageID: ps[k].MessageID, Token: r.Token, Result: []byte(`{"status":200}`), ContentType: "application/json"}
	}
	return cps, nil
}

// leaseBatchComplete is the CompleteBatch of leaseBatchOp.
func leaseBatchComplete(ctx context.Context, s idemdriver.LeaseBatcher, cps []*idemdriver.CompleteParams) error {
	cerrs, err := s.CompleteBatch(ctx, cps)
	if err != nil {
		return err
	}
	for k, e := range cerrs {
		if e != nil {
			return fmt.Errorf("complete %s: %v", cps[k].MessageID, e)
		}
	}
	return nil
}

// BenchmarkLeaseBatch measures idem consume's store work on PostgreSQL:
// AcquireBatch of 64 new messages, then CompleteBatch of them, on
// benchWorkers workers, in each of IDEM_BENCH_ROUNDS rounds, on a table
// seeded with 100,000 completed records of the consumer. It reports
// msgs/s, client-us/msg, server-us/msg, cpu-us/msg, wal-B/msg and fpi/msg
// (see runWorkers); -benchmem's allocs/op are per batch of 64. Run it on
// the durable server:
//
//	IDEM_BENCH_WORKERS=8 IDEM_BENCH_ROUNDS=5 go test -run '^$' -bench BenchmarkLeaseBatch -benchtime 200x -benchmem
func BenchmarkLeaseBatch(b *testing.B) {
	for range benchRounds {
		b.Run("acquire64_complete64", func(b *testing.B) {
			bb := benchSetup(b)
			ctx := context.Background()
			// Seed the consumer (its key) and 100,000 completed records.
			if err := leaseBatchOp(ctx, bb.store, "seed-", 0); err != nil {
				b.Fatal(err)
			}
			execAll(b, bb,
				recordsInsert(bb.table, true, "'bench'", "message_id, fingerprint")+`'h-' || g, sha256(g::text::bytea) FROM generate_series(1, 100000) g`,
				`ANALYZE `+bb.table)
			prefix := benchPrefix()
			runWorkers(b, bb, leaseBatchSize, func(ctx context.Context, i int64) error {
				return leaseBatchOp(ctx, bb.store, prefix, i)
			})
		})
	}
}

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

// batchShape is what a lease batch measurement's elements carry besides
// their IDs: the acquisition's step prefix ("" for none) and the
// completion's result and content type.
type batchShape struct {
	stepPrefix, result, contentType string
}

var (
	// plainBatch is leaseBatchOp's shape: no recovery point, a short
	// JSON result.
	plainBatch = batchShape{result: `{"status":200}`, contentType: "application/json"}
	// sidecarBatch is idem consume's (idemhttp.Deliverer's) shape: the
	// "call started" recovery point saved with each claim, the stored
	// delivery answer with its content type.
	sidecarBatch = batchShape{stepPrefix: "idemhttp:deliver:run:", result: `{"status":200}`, contentType: "application/vnd.idem.delivery-answer+json"}
)

// leaseBatchOp is one operation of the lease batch measurements on s:
// AcquireBatch of leaseBatchSize new messages (IDs prefix + i*size + k),
// each acquired, then CompleteBatch of them with a result, each
// completed.
func leaseBatchOp(ctx context.Context, s idemdriver.LeaseBatcher, prefix string, i int64) error {
	return leaseBatchShapedOp(ctx, s, prefix, i, plainBatch)
}

// leaseBatchShapedOp is leaseBatchOp with the elements of shape sh.
func leaseBatchShapedOp(ctx context.Context, s idemdriver.LeaseBatcher, prefix string, i int64, sh batchShape) error {
	cps, err := leaseBatchShapedAcquire(ctx, s, prefix, i, sh)
	if err != nil {
		return err
	}
	return leaseBatchComplete(ctx, s, cps)
}

// leaseBatchAcquire is the AcquireBatch of leaseBatchOp; it returns the
// completions of the messages it acquired.
func leaseBatchAcquire(ctx context.Context, s idemdriver.LeaseBatcher, prefix string, i int64) ([]*idemdriver.CompleteParams, error) {
	return leaseBatchShapedAcquire(ctx, s, prefix, i, plainBatch)
}

// leaseBatchShapedAcquire is leaseBatchAcquire with the elements of
// shape sh.
func leaseBatchShapedAcquire(ctx context.Context, s idemdriver.LeaseBatcher, prefix string, i int64, sh batchShape) ([]*idemdriver.CompleteParams, error) {
	ps := make([]*idemdriver.AcquireParams, leaseBatchSize)
	sum := fp("payload")
	for k := range ps {
		ps[k] = &idemdriver.AcquireParams{Consumer: "bench", MessageID: prefix + strconv.FormatInt(i*leaseBatchSize+int64(k), 10), Fingerprint: sum, Lease: time.Minute, StepPrefix: sh.stepPrefix}
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
		cps[k] = &idemdriver.CompleteParams{Consumer: "bench", MessageID: ps[k].MessageID, Token: r.Token, Result: []byte(sh.result), ContentType: sh.contentType}
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
// seeded with 100,000 completed records of the consumer; in the case
// sidecar64 with the recovery point and stored answer of idem consume
// (sidecarBatch), in acquire64_complete64 without (plainBatch). It reports
// msgs/s, client-us/msg, server-us/msg, cpu-us/msg, wal-B/msg and fpi/msg
// (see runWorkers); -benchmem's allocs/op are per batch of 64. Run it on
// the durable server:
//
//	IDEM_BENCH_WORKERS=8 IDEM_BENCH_ROUNDS=5 go test -run '^$' -bench BenchmarkLeaseBatch -benchtime 200x -benchmem
func BenchmarkLeaseBatch(b *testing.B) {
	for range benchRounds {
		for _, c := range []struct {
			name string
			sh   batchShape
		}{{"acquire64_complete64", plainBatch}, {"sidecar64", sidecarBatch}} {
			b.Run(c.name, func(b *testing.B) { benchLeaseBatch(b, c.sh) })
		}
	}
}

// benchLeaseBatch is a case of BenchmarkLeaseBatch with the elements of
// shape sh.
func benchLeaseBatch(b *testing.B, sh batchShape) {
	bb := benchSetup(b)
	ctx := context.Background()
	// Seed the consumer (its key) and 100,000 completed records.
	if err := leaseBatchShapedOp(ctx, bb.store, "seed-", 0, sh); err != nil {
		b.Fatal(err)
	}
	execAll(b, bb,
		recordsInsert(bb.table, true, "'bench'", "message_id, fingerprint")+`'h-' || g, sha256(g::text::bytea) FROM generate_series(1, 100000) g`,
		`ANALYZE `+bb.table)
	prefix := benchPrefix()
	runWorkers(b, bb, leaseBatchSize, func(ctx context.Context, i int64) error {
		return leaseBatchShapedOp(ctx, bb.store, prefix, i, sh)
	})
}

package idempgxv5_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestLeaseBatchServerInstructions counts a PostgreSQL backend's
// user-space instructions per message of idem consume's store work:
// AcquireBatch of 64 new messages, then CompleteBatch of them
// (leaseBatchOp), and each alone, on a table of 10,000 completed records
// of the consumer. It needs a PostgreSQL of its own run under valgrind's
// callgrind, as TestClaimServerInstructions does, and skips without one.
// The operations run twice, each time on a new connection: 4 and 14
// batches; the difference of the two backends' totals over the 640
// messages in between is the cost of one message (the statements
// prepared, and the generic plans taken after five executions, in both).
func TestLeaseBatchServerInstructions(t *testing.T) {
	url, dir := os.Getenv("IDEM_CALLGRIND_POSTGRES"), os.Getenv("IDEM_CALLGRIND_DIR")
	if url == "" || dir == "" {
		t.Skip("set IDEM_CALLGRIND_POSTGRES and IDEM_CALLGRIND_DIR (see TestClaimServerInstructions)")
	}
	ctx := context.Background()
	b := setup(t, poolOpts{maxConns: 2, url: url})
	if err := leaseBatchOp(ctx, b.store, "seed-", 0); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		recordsInsert(b.table, true, "'bench'", "message_id, fingerprint") + `'h-' || g, sha256(g::text::bytea) FROM generate_series(1, 10000) g`,
		`ANALYZE ` + b.table,
	} {
		if _, err := b.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	// Each case: the operations measured (on the measured backend, st)
	// and those before them (on the test's own pool, not measured).
	cases := []struct {
		name string
		op   func(st *idempgxv5.Store, tag string, i int) error
	}{
		{fmt.Sprintf("acquire %d + complete %d", leaseBatchSize, leaseBatchSize), func(st *idempgxv5.Store, tag string, i int) error {
			return leaseBatchOp(ctx, st, tag, int64(i))
		}},
		{fmt.Sprintf("acquire %d", leaseBatchSize), func(st *idempgxv5.Store, tag string, i int) error {
			_, err := leaseBatchAcquire(ctx, st, tag, int64(i))
			return err
		}},
		{fmt.Sprintf("complete %d", leaseBatchSize), func(st *idempgxv5.Store, tag string, i int) error {
			cps, err := leaseBatchAcquire(ctx, b.store, tag, int64(i))
			if err == nil {
				err = leaseBatchComplete(ctx, st, cps)
			}
			return err
		}},
	}
	const few, many = 4, 14
	for k, c := range cases {
		run := func(tag string, n int) (pid string) {
			return callgrindBackend(t, url, b.table, n, func(_ *pgxpool.Pool, st *idempgxv5.Store, i int) error {
				return c.op(st, fmt.Sprintf("%s%d-", tag, k), i)
			})
		}
		short, long := run("short-", few), run("long-", many)
		per := (exitInstructions(t, dir, long) - exitInstructions(t, dir, short)) / float64((many-few)*leaseBatchSize)
		t.Logf("%-28s %6.1fk instructions per message", c.name, per/1000)
	}
}

package idemsql_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idemsql"
)

// TestBreakStmtCacheLeaseRefused runs lease-mode deliveries (the acquire
// and the record read are QueryRow statements, the renewal and the
// completion Execs, all on the handle, not in a transaction of the
// caller's) on a MariaDB of the test's own whose max_prepared_stmt_count
// (2) is far below what the Store's statements need, with and without
// interpolateParams: the statement whose prepare the server refuses
// (error 1461) runs again from its text, once. Proved by the attempt
// numbers: the first call of each message's handler must be its attempt
// 1 (a claim run twice would make it 2), every message is completed once
// (one record each, a duplicate at its redelivery), the cache gives up
// once a delivery failed for a refused prepare (a refusal of a statement
// the driver prepared from its text included: the cache's statements
// must not keep the budget from the others), and the server never holds
// more statements than its limit.
func TestBreakStmtCacheLeaseRefused(t *testing.T) {
	svc := ownMariaDB(t)
	const messages, workers, limit, lease = 120, 4, 2, time.Second
	rootSQL(t, svc, "SET GLOBAL max_prepared_stmt_count = "+strconv.Itoa(limit))
	t.Cleanup(func() { rootSQL(t, svc, "SET GLOBAL max_prepared_stmt_count = DEFAULT") })
	for _, interpolate := range []string{"false", "true"} {
		t.Run("interpolateParams="+interpolate, func(t *testing.T) {
			e := newEnv(t, idemsql.MySQL, envOptions{mysqlParams: map[string]string{"interpolateParams": interpolate}})
			e.db.SetMaxOpenConns(workers)
			lc, err := idem.NewLeaseConsumer(e.store, idem.Config{Name: "refused", Lease: lease, PurgeInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = lc.Close() })
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			var mu sync.Mutex
			calls := map[string][]int{} // each handler call's attempt number
			failed := 0
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					for i := w; i < messages; i += workers {
						id := fmt.Sprintf("m-%04d", i)
						for try := 0; ; try++ {
							out, err := lc.Process(ctx, idem.Message{ID: id, Payload: []byte("p")}, func(_ context.Context, a *idem.Attempt) (idem.Result, error) {
								mu.Lock()
								calls[id] = append(calls[id], a.Number)
								mu.Unlock()
								return idem.Result{Body: []byte("r-" + id)}, nil
							})
							if out.Status == idem.Processed || out.Status == idem.Duplicate {
								break
							}
							mu.Lock()
							failed++
							mu.Unlock()
							if ctx.Err() != nil || !(errors.Is(err, idem.ErrStore) || out.Status == idem.InProgress) {
								t.Errorf("%s: %v %v after %d tries", id, out.Status, err, try+1)
								return
							}
							// The redelivery delay of a broker: without
							// interpolateParams every statement with
							// arguments is prepared, so 4 workers
							// contend for a budget of 2 (error 1461 is
							// then the server's answer, not the
							// cache's). A completion and its release
							// both refused leave the lease to run out.
							delay := 5 * time.Millisecond
							if out.Status == idem.InProgress {
								delay = min(out.RetryAfter, lease)
							}
							time.Sleep(delay)
						}
					}
				})
			}
			wg.Wait()
			for i := range messages {
				id := fmt.Sprintf("m-%04d", i)
				if c := calls[id]; len(c) == 0 || c[0] != 1 {
					t.Errorf("%s: handler calls with attempts %v; want the first to be attempt 1 (a claim run twice makes it 2)", id, c)
				}
				out, err := lc.Process(ctx, idem.Message{ID: id, Payload: []byte("p")}, func(context.Context, *idem.Attempt) (idem.Result, error) {
					t.Errorf("%s: handler called at its redelivery after it completed", id)
					return idem.Result{}, nil
				})
				if out.Status != idem.Duplicate || string(out.Result) != "r-"+id {
					t.Errorf("%s redelivered: %v %q %v; want Duplicate with its result", id, out.Status, out.Result, err)
				}
			}
			e.wantRecords("refused", messages)
			more := 0
			for _, c := range calls {
				more += len(c) - 1
			}
			t.Logf("interpolateParams=%s: %d failed deliveries retried, %d handler calls beyond the first; server prepared %d; cached %d", interpolate, failed, more, serverPrepared(t, svc), idemsql.PreparedStatements(e.store))
			// A delivery fails here only for a refused prepare. The
			// coalesced calls (Config.Coalesce) may run on fewer
			// connections than the workers, where the cache's statements
			// fit in the limit and nothing is refused: the cache may then
			// keep them, but not after a refusal.
			if n := idemsql.PreparedStatements(e.store); n != 0 && failed > 0 {
				t.Errorf("%d statements still cached after the server refused a prepare (%d deliveries failed): want the cache given up", n, failed)
			}
			if n := serverPrepared(t, svc); n > limit {
				t.Errorf("Prepared_stmt_count %d over max_prepared_stmt_count %d", n, limit)
			}
		})
	}
}

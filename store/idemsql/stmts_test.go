package idemsql_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idemsql"
)

// TestSQLiteLeaseBatchesRunPreparedStatements checks that SQLite's lease
// batches prepare their statements once and that the prepared ones do
// what the statements do: two rounds of claims (with a recovery point)
// and completions, then every record is completed with its result and a
// claim again finds it so.
func TestSQLiteLeaseBatchesRunPreparedStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newEnv(t, idemsql.SQLite, envOptions{}).store
	claim := func(ids ...string) []*idemdriver.AcquireParams {
		ps := make([]*idemdriver.AcquireParams, len(ids))
		for i, id := range ids {
			ps[i] = &idemdriver.AcquireParams{Consumer: "c", MessageID: id, Fingerprint: []byte("f"), Lease: time.Minute, StepPrefix: "run:"}
		}
		return ps
	}
	for round := range 2 {
		ids := []string{fmt.Sprintf("a%d", round), fmt.Sprintf("b%d", round), fmt.Sprintf("c%d", round)}
		res, errs, err := s.AcquireBatch(ctx, claim(ids...))
		if err != nil {
			t.Fatal(err)
		}
		cs := make([]*idemdriver.CompleteParams, len(ids))
		for i, r := range res {
			if errs[i] != nil || !r.Acquired || r.Token != 1 {
				t.Fatalf("round %d, claim of %s: %+v, %v; want acquired with token 1", round, ids[i], r, errs[i])
			}
			cs[i] = &idemdriver.CompleteParams{Consumer: "c", MessageID: ids[i], Token: r.Token, Result: []byte("r-" + ids[i]), ContentType: "text/plain"}
		}
		cerrs, err := s.CompleteBatch(ctx, cs)
		if err != nil {
			t.Fatal(err)
		}
		for i, e := range cerrs {
			if e != nil {
				t.Fatalf("round %d, completion of %s: %v", round, ids[i], e)
			}
		}
		if n := idemsql.PreparedLeaseStatements(s); n != 5 {
			t.Fatalf("round %d: %d lease statements prepared, want 5", round, n)
		}
		again, errs, err := s.AcquireBatch(ctx, claim(ids...))
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range again {
			if errs[i] != nil || r.Acquired || r.State != idemdriver.StateCompleted || string(r.Result) != "r-"+ids[i] {
				t.Fatalf("round %d, second claim of %s: %+v, %v; want completed with its result", round, ids[i], r, errs[i])
			}
		}
	}
}

package idemsql_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idemsql"
)

// TestClaimReadAfterDuplicate checks the adaptive choice of PostgreSQL's
// claim statement: a duplicate makes the next claim read the record in
// the same statement, a claim that inserts goes back to the plain claim,
// and on either statement the result is the same (claimed, or the stored
// fingerprint) and the transaction's own lock_timeout is put back after
// the claim's.
func TestClaimReadAfterDuplicate(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idemsql.Postgres, envOptions{})
	ctx := context.Background()
	claim := func(id, fp string) idemdriver.ClaimResult {
		t.Helper()
		tx, err := e.store.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = e.store.Rollback(ctx, tx) }()
		if _, err := tx.ExecContext(ctx, `SET LOCAL lock_timeout = '7s'`); err != nil {
			t.Fatal(err)
		}
		res, err := e.store.ClaimTx(ctx, tx, &idemdriver.ClaimParams{Consumer: "c", MessageID: id, Fingerprint: []byte(fp), LockTimeout: 2 * time.Second})
		if err != nil {
			t.Fatalf("claim %s: %v", id, err)
		}
		var lt string
		if err := tx.QueryRowContext(ctx, `SELECT current_setting('lock_timeout')`).Scan(&lt); err != nil {
			t.Fatal(err)
		}
		if lt != "7s" {
			t.Errorf("claim %s (claimed %v): lock_timeout %q after the claim, want the transaction's 7s", id, res.Claimed, lt)
		}
		if res.Claimed {
			if err := e.store.Commit(ctx, tx); err != nil {
				t.Fatal(err)
			}
		}
		return res
	}
	steps := []struct {
		id, fp  string
		reads   bool // the claim runs the reading statement
		claimed bool
		wantFP  string
	}{
		{id: "a", fp: "fa", reads: false, claimed: true},
		{id: "a", fp: "fx", reads: false, claimed: false, wantFP: "fa"},
		{id: "a", fp: "fy", reads: true, claimed: false, wantFP: "fa"},
		{id: "b", fp: "fb", reads: true, claimed: true},
		{id: "c", fp: "fc", reads: false, claimed: true},
		{id: "b", fp: "fb", reads: false, claimed: false, wantFP: "fb"},
	}
	for i, st := range steps {
		if got := idemsql.NextClaimReads(e.store); got != st.reads {
			t.Fatalf("step %d (%s): the claim reads in its statement: %v, want %v", i, st.id, got, st.reads)
		}
		res := claim(st.id, st.fp)
		if res.Claimed != st.claimed {
			t.Fatalf("step %d (%s): claimed %v, want %v", i, st.id, res.Claimed, st.claimed)
		}
		if !st.claimed && !bytes.Equal(res.Fingerprint, []byte(st.wantFP)) {
			t.Fatalf("step %d (%s): fingerprint %q, want %q", i, st.id, res.Fingerprint, st.wantFP)
		}
		if !st.claimed && res.State != idemdriver.StateCompleted {
			t.Fatalf("step %d (%s): state %v, want completed", i, st.id, res.State)
		}
	}
	e.wantRecords("c", 3)
}

package idemcli

import (
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idempgxv5"
)

// TestConsumeStoreOnPostgresIsPgx: `idem consume` on PostgreSQL (no
// pooler) runs lease mode on the pgx store, whose batches are one round
// trip, on the tables `idem migrate` made; what it completes, the
// database/sql store of the same tables reads.
func TestConsumeStoreOnPostgresIsPgx(t *testing.T) {
	t.Parallel()
	pg := serviceURL(t, "IDEM_TEST_POSTGRES_URL")
	table, st := migratedPG(t, pg)
	f := leaseStoreFlags{store: pg, table: table}
	ps, err := f.open(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer ps.close()
	pgx, ok := ps.store.(*idempgxv5.Store)
	if !ok {
		t.Fatalf("the consume store on PostgreSQL is a %T, want *idempgxv5.Store", ps.store)
	}
	ps2, err := openProxyStore(t.Context(), pg, table, "", false, false)
	if err != nil {
		t.Fatal(err)
	}
	defer ps2.close()
	if _, isPgx := ps2.store.(*idempgxv5.Store); isPgx {
		t.Errorf("the proxy's store on PostgreSQL is the pgx store; want database/sql's, unchanged")
	}

	var aps []*idemdriver.AcquireParams
	for i := range 3 {
		aps = append(aps, &idemdriver.AcquireParams{Consumer: "c", MessageID: fmt.Sprintf("m-%d", i), Fingerprint: make([]byte, 32), Lease: time.Minute})
	}
	res, errs, err := pgx.AcquireBatch(t.Context(), aps)
	if err != nil {
		t.Fatal(err)
	}
	var cps []*idemdriver.CompleteParams
	for i, r := range res {
		if errs[i] != nil || !r.Acquired {
			t.Fatalf("%s: %+v, %v; want acquired", aps[i].MessageID, r, errs[i])
		}
		cps = append(cps, &idemdriver.CompleteParams{Consumer: "c", MessageID: aps[i].MessageID, Token: r.Token, Result: []byte("r")})
	}
	if cerrs, err := pgx.CompleteBatch(t.Context(), cps); err != nil || cerrs[0] != nil || cerrs[1] != nil || cerrs[2] != nil {
		t.Fatalf("CompleteBatch: %v, %v", cerrs, err)
	}
	for _, p := range aps {
		r, err := st.store.Acquire(t.Context(), p)
		if err != nil || r.Acquired || r.State != idemdriver.StateCompleted || string(r.Result) != "r" {
			t.Errorf("%s read through database/sql: %+v, %v; want completed with r", p.MessageID, r, err)
		}
	}
}

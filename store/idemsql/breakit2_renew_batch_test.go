package idemsql_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/store/idemsql"
)

// A renewal batch with one record locked by another transaction (an
// operator's open transaction, a fenced Complete in the caller's own
// transaction) should renew the batch's other leases without waiting for
// that lock, as PostgreSQL's batch does (FOR UPDATE SKIP LOCKED:
// TestRenewBatchSkipsLockedRecords in idempgxv5). On MySQL/MariaDB the
// batch is one transaction of fenced UPDATEs that waits for the lock: the
// whole batch fails when its context ends (the LeaseConsumer bounds it by
// the store timeout and the latest local deadline of its attempts), and
// no lease of the batch is renewed, where one Renew per lease would have
// cost the locked record's renewal only. Known: run with
// IDEM_BREAKIT_KNOWN=1.
func TestBreakit2RenewBatchOneLockedRow(t *testing.T) {
	forEachDialect(t, func(t *testing.T, d idemsql.Dialect) {
		if d == idemsql.SQLite {
			t.Skip("SQLite: a write transaction locks the whole database, for single renewals as for batches")
		}
		if d == idemsql.MySQL && os.Getenv("IDEM_BREAKIT_KNOWN") != "1" {
			t.Skip("known: a MySQL/MariaDB renewal batch waits for one locked record (IDEM_BREAKIT_KNOWN=1 runs it)")
		}
		e := newEnv(t, d, envOptions{})
		ctx := t.Context()
		const consumer = "renew-batch-locked"
		fp, _ := idem.SHA256Fingerprint([]byte("p"))
		ids := []string{"a", "b", "c"}
		ps := make([]idemdriver.RenewParams, len(ids))
		for i, id := range ids {
			res := e.mustAcquire(consumer, id, fp, time.Minute)
			ps[i] = idemdriver.RenewParams{Consumer: consumer, MessageID: id, Token: res.Token, Lease: time.Hour}
		}
		tx, err := e.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback() }()
		var one int
		if err := tx.QueryRowContext(ctx, e.q(`SELECT 1 FROM `+e.table+` WHERE message_id = 'b' FOR UPDATE`)).Scan(&one); err != nil {
			t.Fatal(err)
		}
		// The batch's context ends long before the server's lock wait
		// timeout (50s by default): a batch that waits for b fails as a
		// whole, as it does under the LeaseConsumer's bounds.
		bctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		errs, err := e.store.RenewBatch(bctx, ps)
		cancel()
		if err != nil {
			t.Fatalf("RenewBatch with b locked: whole batch failed: %v; want a and c renewed, b alone not judged", err)
		}
		if errs[0] != nil || errs[2] != nil || errors.Is(errs[1], idem.ErrLeaseLost) {
			t.Fatalf("RenewBatch with b locked: %v; want a and c renewed, b not lost", errs)
		}
	})
}

// Renewal batches racing the Completes of their own records on each
// dialect: PostgreSQL's statement over arrays (database/sql, arrays as
// text), MySQL/MariaDB's and SQLite's transaction of fenced UPDATEs
// (idemtest.RenewBatchRacingCompletes).
func TestBreakit2RenewBatchRacingCompletes(t *testing.T) {
	forEachDialect(t, func(t *testing.T, d idemsql.Dialect) {
		e := newEnv(t, d, envOptions{})
		idemtest.RenewBatchRacingCompletes(t, e.leaseSetup())
	})
}

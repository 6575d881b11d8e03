package idemsql_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idemsql"
)

// TestBreakRenewalsConnectionChurn: 40 attempts held by one
// LeaseConsumer at a 1.5s lease for two leases, no row locked, on
// database/sql's default pool (here up to 50 open, 2 kept idle, as
// the idem command's SQL stores have it, with no bound on open ones):
// each renewal tick sends up to 40 renewals at once (the scheduler adds
// goroutines while renewals take longer than Lease/100, as opening a
// connection does), each on a connection of its own, most of them new,
// and the pool closes all but 2 once they return: 83-137 connections
// opened and closed in 3s without the race detector; with it, at load
// 16-17, 0-34 of 39 leases lost (none on a pool of 8 kept open). Known;
// IDEM_BREAKIT_KNOWN=1 runs it.
func TestBreakRenewalsConnectionChurn(t *testing.T) {
	if os.Getenv("IDEM_BREAKIT_KNOWN") == "" {
		t.Skip("known: renewals on database/sql's default pool open and close a connection each; IDEM_BREAKIT_KNOWN=1 runs it")
	}
	t.Parallel()
	renewalsHeld(t)
}

// renewalsHeld holds 40 attempts for two 1.5s leases on MySQL and on
// PostgreSQL, on the test pool (50 open, database/sql's 2 idle), a
// transaction reading the first record meanwhile, and checks that the
// attempts keep their leases. (With that record locked, on a pool of 8
// kept open: idemtest's lease case Locked/RenewalsBesideIt.)
func renewalsHeld(t *testing.T) {
	for _, d := range []idemsql.Dialect{idemsql.MySQL, idemsql.Postgres} {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			e := newEnv(t, d, envOptions{})
			const n, lease = 40, 1500 * time.Millisecond
			c, err := idem.NewLeaseConsumer(e.store, idem.Config{Name: "held", Lease: lease, PurgeInterval: -1, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = c.Close() }()
			attempts := make([]*idem.Attempt, n)
			for i := range attempts {
				a, out, err := c.Acquire(ctx, idem.Message{ID: fmt.Sprintf("m-%02d", i), Payload: []byte("p")}, idem.AcquireOptions{})
				if a == nil {
					t.Fatalf("Acquire m-%02d: %v %v", i, out, err)
				}
				attempts[i] = a
			}
			tx, err := e.db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			query := `SELECT 1 FROM ` + e.table + ` WHERE consumer = ? AND message_id = ?`
			args := []any{"held", attempts[0].Message.ID}
			if d == idemsql.Postgres {
				query, args = `SELECT 1 FROM `+e.table+` WHERE message_id = $1`, args[1:]
			}
			var one int
			if err := tx.QueryRowContext(ctx, query, args...).Scan(&one); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2 * lease) // the transaction is held through several renewal ticks
			if err := tx.Rollback(); err != nil {
				t.Fatal(err)
			}
			lost := 0
			for i, a := range attempts {
				if i == 0 {
					t.Logf("the first record's attempt: context cause %v", context.Cause(a.Context()))
					_, _ = a.Complete(ctx, idem.Result{})
					continue
				}
				if err := a.Context().Err(); err != nil {
					lost++
					t.Errorf("%s: context ended (%v) while another session read the first record", a.Message.ID, context.Cause(a.Context()))
				}
				if out, err := a.Complete(ctx, idem.Result{}); err != nil || out.Status != idem.Processed {
					t.Errorf("%s: Complete = %v, %v; want processed", a.Message.ID, out.Status, err)
				}
			}
			closed := e.db.Stats().MaxIdleClosed
			t.Logf("%d of %d attempts beside the first lost their lease; the pool closed %d connections it could not keep idle", lost, n-1, closed)
			if closed > n/4 {
				t.Errorf("the renewals of %d attempts opened and closed %d connections in two leases", n, closed)
			}
		})
	}
}

package idemsql_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/store/idemsql"
)

// TestOutboxConformance runs idem's outbox conformance suite on every
// dialect, each case on fresh tables (SQLite: a fresh file).
func TestOutboxConformance(t *testing.T) {
	t.Parallel()
	forEachDialect(t, func(t *testing.T, d idemsql.Dialect) {
		serverOf(t, d)
		idemtest.RunOutbox(t, idemtest.Harness[*sql.Tx]{New: func(t *testing.T) *idemtest.Setup[*sql.Tx] {
			return newEnv(t, d, envOptions{}).setup()
		}})
	})
}

// TestOutboxPurgeSkipsLockedRows holds a row lock on one expired sent row
// in another transaction, as a second relay's purge does while it deletes
// it: PurgeOutbox deletes the others without waiting for that lock, and the
// row once the lock is gone (PostgreSQL and MySQL; SQLite has no row
// locks, its writers take turns).
func TestOutboxPurgeSkipsLockedRows(t *testing.T) {
	t.Parallel()
	for _, d := range []idemsql.Dialect{idemsql.Postgres, idemsql.MySQL} {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			serverOf(t, d)
			e := newEnv(t, d, envOptions{})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			ago := `now() - interval '1 hour'`
			if d == idemsql.MySQL {
				ago = `UTC_TIMESTAMP(6) - INTERVAL 1 HOUR`
			}
			var rows []string
			for i := 1; i <= 5; i++ {
				rows = append(rows, fmt.Sprintf(`('r-%d', 'd', 'p', %s)`, i, ago))
			}
			if _, err := e.db.ExecContext(ctx, `INSERT INTO `+e.table+`_outbox (id, destination, payload, sent_at) VALUES `+strings.Join(rows, ", ")); err != nil {
				t.Fatal(err)
			}
			tx, err := e.db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback() }()
			if _, err := tx.ExecContext(ctx, `SELECT id FROM `+e.table+`_outbox WHERE id = 'r-3' FOR UPDATE`); err != nil {
				t.Fatal(err)
			}
			p := &idemdriver.PurgeOutboxParams{Retention: time.Minute, Limit: 100}
			if n, err := e.store.PurgeOutbox(ctx, p); err != nil || n != 4 {
				t.Fatalf("PurgeOutbox beside a locked row = %d, %v; want 4 deleted, no wait", n, err)
			}
			if err := tx.Rollback(); err != nil {
				t.Fatal(err)
			}
			if n, err := e.store.PurgeOutbox(ctx, p); err != nil || n != 1 {
				t.Fatalf("PurgeOutbox after the lock = %d, %v; want 1", n, err)
			}
		})
	}
}

// TestOutboxPoisonIDFailsAndFreesItsKey: a producer in another language
// writes a row whose ID the broker adapters refuse (a control character),
// then a good row of the same key. The publisher fails the first for good
// (as the adapters do, with idem.ErrPermanent): the relay must mark it
// failed, so that it stops holding back its key and the good row is sent.
// The mark used to check the ID like a new message's and refuse it: the
// row was claimed again every lease and its key never moved.
func TestOutboxPoisonIDFailsAndFreesItsKey(t *testing.T) {
	t.Parallel()
	forEachDialect(t, func(t *testing.T, d idemsql.Dialect) {
		serverOf(t, d)
		e := newEnv(t, d, envOptions{})
		ctx := t.Context()
		insert := `INSERT INTO ` + e.table + `_outbox (id, destination, order_key, payload) VALUES (?, 'd', 'k', 'p')`
		if d == idemsql.Postgres {
			insert = strings.Replace(insert, "?", "$1", 1)
		}
		for _, id := range []string{"bad\tid", "good"} {
			if _, err := e.db.ExecContext(ctx, insert, id); err != nil {
				t.Fatal(err)
			}
		}
		var sent []string
		r, err := idem.NewRelay(idem.RelayConfig{Store: e.store, Retention: -1, MinRetry: time.Millisecond, MaxRetry: time.Millisecond,
			Publisher: idem.PublisherFunc(func(_ context.Context, msgs []idem.Outgoing) []error {
				errs := make([]error, len(msgs))
				for i, m := range msgs {
					if err := idemdriver.ValidateMessageID(m.ID, 0); err != nil {
						errs[i] = idem.Permanent(err)
						continue
					}
					sent = append(sent, m.ID)
				}
				return errs
			})})
		if err != nil {
			t.Fatal(err)
		}
		if res, err := r.RunOnce(ctx); err != nil || res.Claimed != 1 || res.Failed != 1 {
			t.Fatalf("first round: %+v, %v; want the bad row claimed and failed", res, err)
		}
		if res, err := r.RunOnce(ctx); err != nil || res.Sent != 1 || len(sent) != 1 || sent[0] != "good" {
			t.Fatalf("second round: %+v, %v, sent %q; want the good row sent", res, err, sent)
		}
		if st, err := e.store.OutboxStats(ctx); err != nil || st.Pending != 0 || st.Failed != 1 {
			t.Fatalf("stats %+v, %v; want 0 pending, 1 failed", st, err)
		}
	})
}

// TestMySQLOrderCheckReadsPendingRowsOnly: the claim's order check (is
// there an earlier pending row of this destination and key?) looks up
// the index on (destination, order_key, sent_at, failed_at, seq) with
// both times NULL (migration 005), so it reads the key's pending rows
// only: on the index of 004 it stepped through every sent row the
// retention keeps, and a claim slowed down by seconds as they piled up.
func TestMySQLOrderCheckReadsPendingRowsOnly(t *testing.T) {
	t.Parallel()
	serverOf(t, idemsql.MySQL)
	e := newEnv(t, idemsql.MySQL, envOptions{})
	ctx := t.Context()
	outbox := e.table + "_outbox"
	var rows []string
	for i := range 400 {
		sent := "NULL"
		if i < 380 {
			sent = "UTC_TIMESTAMP(6)"
		}
		rows = append(rows, fmt.Sprintf(`('r-%d', 'd', 'k%d', 'p', %s)`, i, i%4, sent))
	}
	if _, err := e.db.ExecContext(ctx, `INSERT INTO `+outbox+` (id, destination, order_key, payload, sent_at) VALUES `+strings.Join(rows, ", ")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.ExecContext(ctx, `ANALYZE TABLE `+outbox); err != nil {
		t.Fatal(err)
	}
	res, err := e.db.QueryContext(ctx, `EXPLAIN `+idemsql.OutboxClaimSQL(e.store), 50)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Close()
	cols, _ := res.Columns()
	var plan []string
	found := false
	for res.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := res.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		row := map[string]string{}
		for i, c := range cols {
			row[c] = vals[i].String
		}
		plan = append(plan, fmt.Sprint(row))
		if strings.Contains(row["select_type"], "SUBQUERY") {
			found = true
			if row["key"] != e.table+"_outbox_kpend" || strings.Count(row["ref"], "const") < 2 {
				t.Errorf("the order check uses key %q with ref %q; want %s_outbox_kpend looked up with both times NULL", row["key"], row["ref"], e.table)
			}
		}
	}
	if err := res.Err(); err != nil {
		t.Fatal(err)
	}
	if !found {
		t.Errorf("no order check subquery in the plan: %v", plan)
	}
}

package idemsql_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

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

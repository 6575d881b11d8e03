// Package pgsqltest holds checks that the PostgreSQL stores' tests share.
package pgsqltest

import (
	"context"
	"testing"
	"time"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/sqlstore"
)

// lockHolder: advisory lock key (bigint) -> how many backends of the
// current database hold it, and the lowest backend_xmin and backend_xid
// (as text, NULL when none) of their transactions. pg_locks splits the
// key of a one-bigint advisory lock into classid (high 32 bits) and objid
// (low 32 bits), objsubid 1.
const lockHolder = `SELECT count(*), min(a.backend_xmin::text), min(a.backend_xid::text)
	FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
	WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
	AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND l.classid::bigint = ($1::bigint >> 32) & 4294967295
	AND l.objid::bigint = $1::bigint & 4294967295`

// QueryRow runs a one-row query and scans it into dest: a pool's or a
// *sql.DB's, on a connection other than the one checked.
type QueryRow func(ctx context.Context, dest []any, query string, args ...any) error

// CheckLockHolderIdle checks that exactly one backend holds the advisory
// lock key and that its transaction, idle between statements, keeps no
// snapshot and has no transaction ID (backend_xmin and backend_xid NULL
// in pg_stat_activity): such a transaction holds back vacuum of the whole
// database and makes CREATE INDEX CONCURRENTLY wait for it. when names
// the moment in failures.
func CheckLockHolderIdle(tb testing.TB, ctx context.Context, q QueryRow, key int64, when string) {
	tb.Helper()
	var (
		holders   int64
		xmin, xid *string
	)
	if err := q(ctx, []any{&holders, &xmin, &xid}, lockHolder, key); err != nil {
		tb.Fatalf("%s: %v", when, err)
	}
	if holders != 1 {
		tb.Fatalf("%s: %d backends hold the lock, want 1", when, holders)
	}
	if xmin != nil || xid != nil {
		tb.Errorf("%s: the lock's transaction has backend_xmin %s, backend_xid %s; want both NULL", when, orNull(xmin), orNull(xid))
	}
}

// CheckPurgeHoldsNoSnapshot checks, with CheckLockHolderIdle, the
// transaction that holds s's purge lock (of table and consumer) after
// BeginPurge and again after a DeleteBatch, which asks the lock
// transaction for the lock again first.
func CheckPurgeHoldsNoSnapshot(tb testing.TB, ctx context.Context, q QueryRow, s idemdriver.PurgeSession, table, consumer string) {
	tb.Helper()
	key := sqlstore.LockKey("purge", table, consumer)
	CheckLockHolderIdle(tb, ctx, q, key, "after BeginPurge")
	if _, err := s.DeleteBatch(ctx, &idemdriver.PurgeBatchParams{Horizon: time.Now().Add(-time.Hour), Limit: 10}); err != nil {
		tb.Fatal(err)
	}
	CheckLockHolderIdle(tb, ctx, q, key, "after a batch")
}

func orNull(p *string) string {
	if p == nil {
		return "NULL"
	}
	return *p
}

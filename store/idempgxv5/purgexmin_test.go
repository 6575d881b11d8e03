package idempgxv5_test

import (
	"context"
	"testing"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/pgsql/pgsqltest"
)

// TestPurgeLockHoldsNoSnapshot: the transaction that holds the purge lock
// idles for the whole purge, so it keeps no snapshot and no transaction
// ID, after the lock is taken and after a batch has asked it again; on
// PostgreSQL and through PgBouncer in each query exec mode it supports.
func TestPurgeLockHoldsNoSnapshot(t *testing.T) {
	t.Parallel()
	cases := map[string]func(t *testing.T) *bundle{
		"direct": func(t *testing.T) *bundle { return setup(t, poolOpts{}) },
	}
	for _, mode := range bouncerModes {
		cases["PgBouncer/"+modeName(mode)] = func(t *testing.T) *bundle { return bouncerSetup(t, mode) }
	}
	for name, open := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := open(t)
			s, err := b.store.BeginPurge(ctx, &idemdriver.BeginPurgeParams{Consumer: "c"})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close(ctx)
			q := func(ctx context.Context, dest []any, query string, args ...any) error {
				return b.pool.QueryRow(ctx, query, args...).Scan(dest...)
			}
			pgsqltest.CheckPurgeHoldsNoSnapshot(t, ctx, q, s, b.table, "c")
		})
	}
}

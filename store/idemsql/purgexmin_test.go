package idemsql_test

import (
	"context"
	"net/url"
	"testing"

	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/pgsql/pgsqltest"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/idemsql"
)

// TestPurgeLockHoldsNoSnapshot: on PostgreSQL (pgx through database/sql)
// the transaction that holds the purge lock idles for the whole purge, so
// it keeps no snapshot and no transaction ID, after the lock is taken and
// after a batch has asked it again; directly and through PgBouncer with
// the extended protocol (cache_describe).
func TestPurgeLockHoldsNoSnapshot(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testenv.URL(t, testenv.PgBouncerEnv, "postgres://idem:idem@127.0.0.1:6432/idem_test?sslmode=disable"))
	if err != nil {
		t.Fatalf("%s: %v", testenv.PgBouncerEnv, err)
	}
	q := u.Query()
	q.Set("default_query_exec_mode", "cache_describe")
	u.RawQuery = q.Encode()
	for name, o := range map[string]envOptions{"direct": {}, "PgBouncer": {pgURL: u.String()}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, idemsql.Postgres, o)
			ctx := t.Context()
			s, err := e.store.BeginPurge(ctx, &idemdriver.BeginPurgeParams{Consumer: "c"})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close(context.Background())
			q := func(ctx context.Context, dest []any, query string, args ...any) error {
				return e.db.QueryRowContext(ctx, query, args...).Scan(dest...)
			}
			pgsqltest.CheckPurgeHoldsNoSnapshot(t, ctx, q, s, e.table, "c")
		})
	}
}

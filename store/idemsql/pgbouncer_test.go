package idemsql_test

import (
	"database/sql"
	"net/url"
	"testing"

	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/idemsql"
)

// TestPgBouncerConformance runs the store conformance suites
// (transactional, with batches, purges and migrations; lease; outbox) on
// the PostgreSQL dialect through PgBouncer in transaction pooling, with
// pgx's database/sql driver in each query exec mode that PgBouncer 1.18
// supports, chosen in the URL (default_query_exec_mode): neither prepares
// a named statement.
func TestPgBouncerConformance(t *testing.T) {
	t.Parallel()
	raw := testenv.URL(t, testenv.PgBouncerEnv, "postgres://idem:idem@127.0.0.1:6432/idem_test?sslmode=disable")
	for _, mode := range []string{"cache_describe", "simple_protocol"} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatalf("%s: %v", testenv.PgBouncerEnv, err)
		}
		q := u.Query()
		q.Set("default_query_exec_mode", mode)
		u.RawQuery = q.Encode()
		o := envOptions{pgURL: u.String()}
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			h := idemtest.Harness[*sql.Tx]{New: func(t *testing.T) *idemtest.Setup[*sql.Tx] {
				return newEnv(t, idemsql.Postgres, o).setup()
			}}
			t.Run("Tx", func(t *testing.T) { t.Parallel(); idemtest.Run(t, h) })
			t.Run("Lease", func(t *testing.T) {
				t.Parallel()
				idemtest.RunLease(t, idemtest.LeaseHarness{New: func(t *testing.T) *idemtest.LeaseSetup {
					return newEnv(t, idemsql.Postgres, o).leaseSetup()
				}})
			})
			t.Run("Outbox", func(t *testing.T) { t.Parallel(); idemtest.RunOutbox(t, h) })
		})
	}
}

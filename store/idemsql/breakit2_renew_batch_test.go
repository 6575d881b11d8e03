package idemsql_test

import (
	"testing"

	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/store/idemsql"
)

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

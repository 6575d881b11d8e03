package idemsql_test

import (
	"database/sql"
	"testing"

	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/store/idemsql"
)

// TestConformanceMySQLWithoutReturning runs the suite on MariaDB with the
// batch claim of a server without INSERT ... RETURNING (MySQL's: a
// bitmask of the duplicates per 64 rows), which MariaDB would not take.
func TestConformanceMySQLWithoutReturning(t *testing.T) {
	t.Parallel()
	serverOf(t, idemsql.MySQL)
	idemtest.Run(t, idemtest.Harness[*sql.Tx]{New: func(t *testing.T) *idemtest.Setup[*sql.Tx] {
		e := newEnv(t, idemsql.MySQL, envOptions{})
		idemsql.WithoutReturning(e.store)
		return e.setup()
	}})
}

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
		idemsql.WithoutReturning(e.db)
		return e.setup()
	}})
}

// TestConformancePostgresTextArrays runs the suites on PostgreSQL through
// a driver the store does not recognise as pgx's stdlib, so that its
// batch statements send their arrays as literals in strings (the path of
// any other driver), and checks which path each store took.
func TestConformancePostgresTextArrays(t *testing.T) {
	t.Parallel()
	serverOf(t, idemsql.Postgres)
	if e := newEnv(t, idemsql.Postgres, envOptions{}); !idemsql.NativeArrays(e.store) {
		t.Fatal("a store over pgx's stdlib does not send native arrays")
	}
	if e := newEnv(t, idemsql.Postgres, envOptions{pgWrapped: true}); idemsql.NativeArrays(e.store) {
		t.Fatal("a store over another driver sends native arrays")
	}
	t.Run("tx", func(t *testing.T) {
		idemtest.Run(t, idemtest.Harness[*sql.Tx]{New: func(t *testing.T) *idemtest.Setup[*sql.Tx] {
			return newEnv(t, idemsql.Postgres, envOptions{pgWrapped: true}).setup()
		}})
	})
	t.Run("lease", func(t *testing.T) {
		idemtest.RunLease(t, idemtest.LeaseHarness{New: func(t *testing.T) *idemtest.LeaseSetup {
			return newEnv(t, idemsql.Postgres, envOptions{pgWrapped: true}).leaseSetup()
		}})
	})
}

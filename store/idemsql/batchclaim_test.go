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
	t.Run("tx", func(t *testing.T) { runSuite(t, idemsql.Postgres, envOptions{pgWrapped: true}, nil) })
	t.Run("lease", func(t *testing.T) {
		idemtest.RunLease(t, idemtest.LeaseHarness{New: func(t *testing.T) *idemtest.LeaseSetup {
			return newEnv(t, idemsql.Postgres, envOptions{pgWrapped: true}).leaseSetup()
		}})
	})
}

// TestConformancePostgresClaimModes runs the transactional suite on
// PostgreSQL with each claim statement forced: the plain claim (a
// duplicate read by a second statement) and the claim that reads the
// record in the same statement.
func TestConformancePostgresClaimModes(t *testing.T) {
	t.Parallel()
	serverOf(t, idemsql.Postgres)
	for _, m := range []struct {
		name  string
		force func(*idemsql.Store)
	}{{"plain", idemsql.ClaimPlain}, {"read", idemsql.ClaimRead}} {
		t.Run(m.name, func(t *testing.T) { runSuite(t, idemsql.Postgres, envOptions{}, m.force) })
	}
}

// runSuite runs the transactional suite on dialect d, each Setup on a
// fresh env made with o and then given to tweak (when not nil).
func runSuite(t *testing.T, d idemsql.Dialect, o envOptions, tweak func(*idemsql.Store)) {
	idemtest.Run(t, idemtest.Harness[*sql.Tx]{New: func(t *testing.T) *idemtest.Setup[*sql.Tx] {
		e := newEnv(t, d, o)
		if tweak != nil {
			tweak(e.store)
		}
		return e.setup()
	}})
}

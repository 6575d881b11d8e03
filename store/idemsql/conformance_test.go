package idemsql_test

import (
	"database/sql"
	"testing"

	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/store/idemsql"
)

// TestConformance runs the idemtest suite on every dialect, each Setup on
// fresh tables (SQLite: a fresh file).
func TestConformance(t *testing.T) {
	t.Parallel()
	forEachDialect(t, func(t *testing.T, d idemsql.Dialect) {
		serverOf(t, d)
		idemtest.Run(t, idemtest.Harness[*sql.Tx]{New: func(t *testing.T) *idemtest.Setup[*sql.Tx] {
			return newEnv(t, d, envOptions{}).setup()
		}})
	})
}

// TestConformanceMySQLFoundRows runs the suite on MySQL with the DSN
// settings that change what the server reports or how values travel:
// clientFoundRows=true (rows affected counts a duplicate as 1),
// interpolateParams=true (no server-side prepared statements but the
// store's own, prepared once per connection) and
// parseTime=false (DATETIME values arrive as text).
func TestConformanceMySQLFoundRows(t *testing.T) {
	t.Parallel()
	serverOf(t, idemsql.MySQL)
	o := envOptions{mysqlParams: map[string]string{"clientFoundRows": "true", "interpolateParams": "true", "parseTime": "false"}}
	idemtest.Run(t, idemtest.Harness[*sql.Tx]{New: func(t *testing.T) *idemtest.Setup[*sql.Tx] {
		return newEnv(t, idemsql.MySQL, o).setup()
	}})
}

// serverOf skips (or fails) the test early when d's server is not configured.
func serverOf(t *testing.T, d idemsql.Dialect) {
	t.Helper()
	switch d {
	case idemsql.Postgres:
		serverURL(t, envPostgres)
	case idemsql.MySQL:
		serverURL(t, envMySQL)
	}
}

// setup returns the env as an idemtest.Setup.
func (e *env) setup() *idemtest.Setup[*sql.Tx] {
	return &idemtest.Setup[*sql.Tx]{
		Store:        e.store,
		WriteEffect:  e.writeEffect,
		CountEffects: e.countEffects,
		CountRecords: e.countRecords,
		Shift:        e.shift,
	}
}

// TestLeaseConformance runs the idemtest lease suite on every dialect,
// each LeaseSetup on fresh tables (SQLite: a fresh file).
func TestLeaseConformance(t *testing.T) {
	t.Parallel()
	forEachDialect(t, func(t *testing.T, d idemsql.Dialect) {
		serverOf(t, d)
		idemtest.RunLease(t, idemtest.LeaseHarness{New: func(t *testing.T) *idemtest.LeaseSetup {
			return newEnv(t, d, envOptions{}).leaseSetup()
		}})
	})
}

// TestLeaseConformanceMySQLFoundRows runs the lease suite on MySQL with
// clientFoundRows=true (rows affected counts matched rows, changed or
// not), interpolateParams=true and parseTime=false.
func TestLeaseConformanceMySQLFoundRows(t *testing.T) {
	t.Parallel()
	serverOf(t, idemsql.MySQL)
	o := envOptions{mysqlParams: map[string]string{"clientFoundRows": "true", "interpolateParams": "true", "parseTime": "false"}}
	idemtest.RunLease(t, idemtest.LeaseHarness{New: func(t *testing.T) *idemtest.LeaseSetup {
		return newEnv(t, idemsql.MySQL, o).leaseSetup()
	}})
}

// leaseSetup returns the env as an idemtest.LeaseSetup.
func (e *env) leaseSetup() *idemtest.LeaseSetup {
	s := &idemtest.LeaseSetup{
		Store:        e.store,
		ExpireLease:  e.expireLease,
		CountRecords: e.countRecords,
		Shift:        e.shift,
	}
	if e.dialect != idemsql.SQLite {
		// SQLite has one writer: a write transaction held open stops
		// every write, by design.
		s.LockRecord = e.lockRecord
		// Eight connections kept idle, as idempgxv5's pools keep theirs:
		// the renewals of the Locked case's 40 attempts (one Renew each
		// on MySQL) would otherwise open and close a connection each
		// (TestBreakRenewalsConnectionChurn).
		e.db.SetMaxIdleConns(8)
	}
	return s
}

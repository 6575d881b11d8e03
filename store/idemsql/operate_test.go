package idemsql_test

import (
	"database/sql"
	"testing"

	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/store/idemsql"
)

// TestOperate runs the idemtest operator cases, the records' list and
// actions and the outbox's, on every dialect.
func TestOperate(t *testing.T) {
	t.Parallel()
	forEachDialect(t, func(t *testing.T, d idemsql.Dialect) {
		serverOf(t, d)
		idemtest.RunOperate(t, idemtest.LeaseHarness{New: func(t *testing.T) *idemtest.LeaseSetup {
			return newEnv(t, d, envOptions{}).leaseSetup()
		}})
		idemtest.RunOutboxOperate(t, idemtest.Harness[*sql.Tx]{New: func(t *testing.T) *idemtest.Setup[*sql.Tx] {
			return newEnv(t, d, envOptions{}).setup()
		}})
	})
}

// TestOperateMySQLFoundRows runs the operator cases on MySQL with
// clientFoundRows=true (rows affected counts matched rows),
// interpolateParams=true and parseTime=false.
func TestOperateMySQLFoundRows(t *testing.T) {
	t.Parallel()
	serverOf(t, idemsql.MySQL)
	o := envOptions{mysqlParams: map[string]string{"clientFoundRows": "true", "interpolateParams": "true", "parseTime": "false"}}
	idemtest.RunOperate(t, idemtest.LeaseHarness{New: func(t *testing.T) *idemtest.LeaseSetup {
		return newEnv(t, idemsql.MySQL, o).leaseSetup()
	}})
	idemtest.RunOutboxOperate(t, idemtest.Harness[*sql.Tx]{New: func(t *testing.T) *idemtest.Setup[*sql.Tx] {
		return newEnv(t, idemsql.MySQL, o).setup()
	}})
}

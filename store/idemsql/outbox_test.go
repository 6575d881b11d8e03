package idemsql_test

import (
	"database/sql"
	"testing"

	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/store/idemsql"
)

// TestOutboxConformance runs idem's outbox conformance suite on every
// dialect, each case on fresh tables (SQLite: a fresh file).
func TestOutboxConformance(t *testing.T) {
	t.Parallel()
	forEachDialect(t, func(t *testing.T, d idemsql.Dialect) {
		serverOf(t, d)
		idemtest.RunOutbox(t, idemtest.Harness[*sql.Tx]{New: func(t *testing.T) *idemtest.Setup[*sql.Tx] {
			return newEnv(t, d, envOptions{}).setup()
		}})
	})
}

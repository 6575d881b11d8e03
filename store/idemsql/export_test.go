package idemsql

import (
	"context"

	"github.com/idem-go/idem/internal/sqlstore"
)

// OutboxClaimSQL is the relay's claim statement on s's outbox (on MySQL
// the locking selection of its two statements), for tests of its plan.
func OutboxClaimSQL(s *Store) string { return s.outbox().ClaimSQL() }

// OpsReads is the operator's read statements on s (sqlstore.Ops.Reads),
// for tests of their plans.
func OpsReads(s *Store) map[string]string {
	o, err := withOps(context.Background(), s, func(o *sqlstore.Ops) (*sqlstore.Ops, error) { return o, nil })
	if err != nil {
		panic(err)
	}
	return o.Reads()
}

// WithoutReturning makes the MySQL batch claims of s take the path of a
// server without INSERT ... RETURNING (MySQL's), for tests on MariaDB.
// Call it before s claims a batch.
func WithoutReturning(s *Store) { s.returning.set(false) }

// WithoutSQLiteBatchStatement makes the SQLite batch claims of s take the
// path of an SQLite without the batch claim's statement (the single
// claim's statements, element by element). Call it before s claims a
// batch.
func WithoutSQLiteBatchStatement(s *Store) { s.batchStatement.set(false) }

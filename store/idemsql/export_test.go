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

// NativeArrays reports whether s's PostgreSQL batch statements send
// native arrays (the driver is pgx's stdlib).
func NativeArrays(s *Store) bool { return nativeArrays(s.db) }

// ClaimPlain and ClaimRead make s's PostgreSQL claims always run the plain
// claim, or always the claim that reads the record in the same statement.
func ClaimPlain(s *Store) { s.claimMode = claimPlain }

// ClaimRead: see ClaimPlain.
func ClaimRead(s *Store) { s.claimMode = claimRead; s.pgClaimRead.Store(true) }

// NextClaimReads reports whether s's next PostgreSQL claim runs the
// claim that reads the record in the same statement.
func NextClaimReads(s *Store) bool { return s.pgClaimRead.Load() }

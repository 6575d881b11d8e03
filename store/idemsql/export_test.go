package idemsql

// OutboxClaimSQL is the relay's claim statement on s's outbox (on MySQL
// the locking selection of its two statements), for tests of its plan.
func OutboxClaimSQL(s *Store) string { return s.outbox().ClaimSQL() }

// OpsReads is the operator's read statements on s (sqlstore.Ops.Reads),
// for tests of their plans.
func OpsReads(s *Store) map[string]string { return s.ops().Reads() }

package idemsql

// PreparedLeaseStatements is how many of SQLite's lease statements s has
// prepared (stmtCache), for the test that they are prepared once.
func PreparedLeaseStatements(s *Store) int {
	s.stmts.mu.Lock()
	defer s.stmts.mu.Unlock()
	return len(s.stmts.m)
}

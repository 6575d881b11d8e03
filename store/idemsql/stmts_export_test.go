package idemsql

// PreparedStatements is how many statements s has prepared (stmtCache).
func PreparedStatements(s *Store) int {
	if m := s.stmts.m.Load(); m != nil {
		return len(*m)
	}
	return 0
}

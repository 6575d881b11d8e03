package idem

import "time"

// Test hooks of the MemoryStore for the package's own tests.

func CountRecords(s *MemoryStore, consumer string) int { return s.countRecords(consumer) }

func ExpireLease(s *MemoryStore, consumer, id string) bool { return s.expireLease(consumer, id) }

func Shift(s *MemoryStore, consumer string, d time.Duration) { s.shift(consumer, d) }

// MaxRenewers is maxRenewers, for the renewal tests.
const MaxRenewers = maxRenewers

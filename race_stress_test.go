package idem_test

import "testing"

// stressAttempts is n, or a quarter of it (at least 50) under the race
// detector.
func stressAttempts(n int) int {
	if raceDetector && n > 50 {
		return max(50, n/4)
	}
	return n
}

// skipUnderRace skips a renewal stress test under the race detector: with
// hundreds of attempts held in a synctest bubble and every goroutine's
// stack read (renewers), the race runtime crashed (SIGSEGV, in its stack
// depot) in 3 of about 12 runs of the package, at every size tried. The
// test runs in full without -race (go test -run TestBreakRenewals .).
func skipUnderRace(t *testing.T) {
	t.Helper()
	if raceDetector {
		t.Skip("renewal stress test: the race runtime crashes under it (SIGSEGV in its stack depot); run without -race")
	}
}

package idem_test

// stressAttempts is n, or a quarter of it (at least 50) under the race
// detector.
func stressAttempts(n int) int {
	if raceDetector && n > 50 {
		return max(50, n/4)
	}
	return n
}

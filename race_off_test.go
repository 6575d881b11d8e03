//go:build !race

package idem_test

// raceDetector is whether the tests run under the race detector (see
// race_on_test.go).
const raceDetector = false

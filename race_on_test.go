//go:build race

package idem_test

// raceDetector is whether the tests run under the race detector, whose
// runtime crashed (SIGSEGV in __sanitizer::StackDepotBase::Put) in the
// renewal stress tests with hundreds of attempts held at once in a
// synctest bubble; under it they hold fewer (stressAttempts).
const raceDetector = true

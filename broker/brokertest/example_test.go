package brokertest_test

import (
	"fmt"
	"strings"

	"github.com/idem-go/idem/broker/brokertest"
)

// An adapter's test calls Run with a Harness whose New returns a fresh
// Broker per case:
//
//	func TestConformance(t *testing.T) {
//		brokertest.Run(t, brokertest.Harness{New: newTestBroker})
//	}
//
// Run then runs these cases in transactional and in lease mode.
func Example() {
	for _, c := range brokertest.CaseNames() {
		name, _, _ := strings.Cut(c, ":")
		fmt.Println(name)
	}
	// Output:
	// ProcessedOnce
	// ProducerDuplicates
	// CrashAfterCommit
	// HandlerError
	// AckTimeout
	// BadMessages
	// GroupCrashAndJoin
	// StopWaitsForInFlight
	// Batch
	// Lifecycle
	// Panics
	// StoreDown
	// ContextCancelled
	// DeadLetterFinal
	// StoreLatency
	// HandlerTimeout
	// HugePayload
}

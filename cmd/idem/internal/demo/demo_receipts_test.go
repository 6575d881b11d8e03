//go:build !nodemo

package demo

import (
	"testing"
)

// wantReceiptedOnce checks the receipts story of an idem run of n
// payments: one PaymentCharged event emitted per payment, one receipt
// sent per payment, none double, none lost.
func wantReceiptedOnce(t *testing.T, rep report, n int64) {
	t.Helper()
	if rep.EventsEmitted != n || rep.ReceiptsSent != n || rep.DoubleReceipts != 0 || rep.LostReceipts != 0 {
		t.Errorf("events emitted %d, receipts sent %d, double %d, lost %d: want %d, %d, 0, 0",
			rep.EventsEmitted, rep.ReceiptsSent, rep.DoubleReceipts, rep.LostReceipts, n, n)
	}
}

// TestDemoReceiptsThroughRelayCrashes: with a high crash rate the relay
// dies after commits and before sending, and after sending and before
// marking; the rows come back when the dead relay's lease ends and go out
// again with the same IDs, and the receipts consumer, crashing too, sends
// one receipt per payment. The exit status is 0 and ok is true only then.
func TestDemoReceiptsThroughRelayCrashes(t *testing.T) {
	t.Parallel()
	rep, _ := demoJSON(t, "--messages", "400", "--crash-rate", "0.05", "--consumers", "3", "--ack-wait", "300ms", "--seed", "3")
	wantChargedOnce(t, rep, 400)
	if rep.RelayCrashes == 0 || rep.ReceiptCrashes == 0 {
		t.Errorf("relay crashes %d, receipts consumer crashes %d: want both exercised", rep.RelayCrashes, rep.ReceiptCrashes)
	}
	if !rep.OK {
		t.Errorf("report %+v: want ok", rep)
	}
}

//go:build !nodemo

package demo

import (
	"strings"
	"testing"
)

// TestDemoTellsItsStory: the same story with and without idem, same seed
// and faults: without idem the report shows double charges and lost
// payments (acked on receipt, dropped by a crash) and exits 0 (a
// demonstration); with idem it is ok. Both JSON reports carry the settings
// and ok, and the text report explains its counters and ends with a verdict
// that does not hide the temporary folder.
func TestDemoTellsItsStory(t *testing.T) {
	t.Parallel()
	args := []string{"--messages", "300", "--duplicates", "0.5", "--crash-rate", "0.05", "--seed", "7"}
	naive, naiveOut := demoJSON(t, append(args, "--without-idem")...)
	if naive.DoubleCharges == 0 || naive.Lost == 0 || naive.OK || !naive.Settings.WithoutIdem || naive.DuplicatesAbsorbed != 0 {
		t.Errorf("--without-idem report %+v: want double charges and lost payments, not ok", naive)
	}
	// Every delivery was acked on receipt; a lost payment is one a crash
	// dropped after its ack (a dropped one may come back as a duplicate).
	if n := naive.NaiveConsumer; n == nil || n.AckedBeforeCharge == 0 || n.DroppedAfterAck < naive.Lost ||
		!strings.Contains(naive.Verdict, "dropped by a crash before their ledger commit") {
		t.Errorf("--without-idem report does not say why payments were lost: %s", naiveOut)
	}
	// Every charge publishes its own event after its commit (a crash in
	// between loses it), and every copy sends a receipt.
	if naive.DoubleReceipts == 0 || naive.LostReceipts == 0 || naive.ReceiptsSent < naive.EventsEmitted {
		t.Errorf("--without-idem report %+v: want double and lost receipts, a receipt per event", naive)
	}
	rep, out := demoJSON(t, args...)
	if !rep.OK || rep.DoubleCharges != 0 || rep.Lost != 0 || rep.Settings.WithoutIdem || rep.NaiveConsumer != nil {
		t.Errorf("report %+v: want ok", rep)
	}
	if !strings.Contains(out, `"ok":true`) || !strings.Contains(out, `"settings":{"messages":300,"duplicates":0.5,"crash_rate":0.05,`) ||
		rep.Settings.Seed != 7 || !rep.Settings.Temporary {
		t.Errorf("JSON report lacks ok or the settings: %s", out)
	}

	code, text, errOut := run(t, append([]string{"demo", "--progress", "none", "--messages", "50"}, args[2:]...)...)
	if code != 0 {
		t.Fatalf("demo: exit %d %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(text), "\n")
	if !strings.Contains(lines[0], "temporary folder, removed at the end") {
		t.Errorf("first line %q does not say its database is temporary", lines[0])
	}
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, "verdict: ok: every one of the 50 payments charged exactly once") {
		t.Errorf("last line %q, want the verdict", last)
	}
	for _, want := range []string{"redeliveries count too", "same derived key", "events emitted", "double receipts", "lost receipts", "their lease ended"} {
		if !strings.Contains(text, want) {
			t.Errorf("the report does not explain %q:\n%s", want, text)
		}
	}
}

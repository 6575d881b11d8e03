//go:build !nodemo

package demo

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
)

// demoSettings are the settings of a demo run, recorded in its report so
// that a JSON report says what it measured.
type demoSettings struct {
	Messages    int     `json:"messages"`
	Duplicates  float64 `json:"duplicates"`
	CrashRate   float64 `json:"crash_rate"`
	Consumers   int     `json:"consumers"`
	AckWaitS    float64 `json:"ack_wait_s"`
	TimeoutS    float64 `json:"timeout_s"`
	Seed        uint64  `json:"seed"`
	Broker      string  `json:"broker"`
	Store       string  `json:"store"`
	WithoutIdem bool    `json:"without_idem"`
	// Temporary is true when the databases and the stream were in a
	// temporary folder, removed when the run ended (no --dir).
	Temporary bool `json:"temporary"`
}

// tell completes rep with the settings, ok and the verdict.
func (r *demoRun) tell(rep report) report {
	o := r.o
	rep.Settings = demoSettings{Messages: o.Messages, Duplicates: o.Duplicates, CrashRate: o.CrashRate, Consumers: o.Consumers,
		AckWaitS: o.AckWait.Seconds(), TimeoutS: o.Timeout.Seconds(), Seed: o.Seed, Broker: rep.Broker, Store: rep.Store,
		WithoutIdem: o.WithoutIdem, Temporary: o.Dir == ""}
	n := int64(o.Messages)
	rep.OK = rep.DoubleCharges == 0 && rep.Lost == 0 && rep.LedgerCharges == n && rep.ProviderCharges == n
	rep.OK = rep.OK && rep.receiptsOK()
	switch {
	case o.WithoutIdem:
		rep.Verdict = fmt.Sprintf("without idem: %d double charges and %d lost payments out of %d, from %d duplicates published and %d consumer crashes "+
			"(each delivery charged anew; payments acknowledged on receipt and dropped by a crash before their ledger commit never came back); "+
			"run `idem demo` (same seed, same faults) to see idem prevent them",
			rep.DoubleCharges, rep.Lost, n, rep.DuplicatesPublished, rep.ConsumerCrashes)
		rep.Verdict += fmt.Sprintf("; receipts: %d double, %d lost", rep.DoubleReceipts, rep.LostReceipts)
	case rep.OK:
		rep.Verdict = fmt.Sprintf("ok: every one of the %d payments charged exactly once, through %d duplicates published, %d consumer crashes and %d deliveries",
			n, rep.DuplicatesPublished, rep.ConsumerCrashes, rep.Deliveries)
		rep.Verdict += fmt.Sprintf("; one receipt each, through %d relay crashes and %d receipts consumer crashes", rep.RelayCrashes, rep.ReceiptCrashes)
	default:
		rep.Verdict = fmt.Sprintf("FAILED: %d double charges, %d lost payments (%d ledger charges, %d provider charges for %d payments)",
			rep.DoubleCharges, rep.Lost, rep.LedgerCharges, rep.ProviderCharges, n)
		rep.Verdict += fmt.Sprintf("; %d double receipts, %d lost receipts (%d sent)", rep.DoubleReceipts, rep.LostReceipts, rep.ReceiptsSent)
	}
	return rep
}

// printReport prints rep: one JSON object, or a table with one line of
// explanation per counter and the verdict last.
func printReport(w io.Writer, rep report, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(w).Encode(rep)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k string, v any, why string) { fmt.Fprintf(tw, "%s\t%v\t%s\n", k, v, why) }
	title, store := "idem demo", rep.Store
	if rep.Settings.WithoutIdem {
		title = "idem demo --without-idem (a naive consumer: acks on receipt and charges afterwards, no processed-message record, a new provider key per attempt)"
	}
	if rep.Settings.Temporary {
		store += " (in a temporary folder, removed at the end; --dir keeps it)"
	}
	fmt.Fprintf(w, "%s: payments on %s, store %s\n", title, rep.Broker, store)
	fmt.Fprintf(w, "settings: %d messages, duplicates %.3g, crash rate %.3g, %d consumers, ack wait %gs, seed %d\n",
		rep.Settings.Messages, rep.Settings.Duplicates, rep.Settings.CrashRate, rep.Settings.Consumers, rep.Settings.AckWaitS, rep.Settings.Seed)
	absorbed := "deliveries found already processed and acked without charging: the duplicates that reached the consumers (those published less those the broker dropped), and redeliveries count too (a crash between commit and ack, a slow ack)"
	lost := "payments never written to the ledger"
	if rep.Settings.WithoutIdem {
		absorbed = "none: without idem every delivery charges"
	}
	if n := rep.NaiveConsumer; n != nil {
		lost += fmt.Sprintf(": of the %d deliveries acknowledged on receipt, %d were dropped by a crash before their ledger commit, "+
			"and the broker, told they were done, never delivered them again (unless a duplicate did)", n.AckedBeforeCharge, n.DroppedAfterAck)
	}
	row("messages", rep.Messages, "payments published, each with its payment ID as the message ID")
	row("deliveries", rep.Deliveries, "messages handed to a consumer: first deliveries, duplicates and redeliveries")
	row("duplicates published", rep.DuplicatesPublished, "payments the producer published a second time, as a retrying producer does")
	row("publishes retried", rep.PublishRetries, "publishes made again, with the same message ID, after the broker was unavailable (a restart)")
	row("duplicates dropped by the broker", rep.BrokerDroppedDups, "of those, copies the broker's own dedupe window dropped (JetStream Nats-Msg-Id)")
	row("duplicates absorbed by idem", rep.DuplicatesAbsorbed, absorbed)
	row("in-progress redeliveries", rep.InProgressRedeliveries, "deliveries while another consumer held the message, sent back for later")
	crashes := "consumers killed after the provider call (before the commit) or after the commit (before the ack)"
	if rep.NaiveConsumer != nil {
		crashes = "consumers killed after the provider call (before the commit) or after the commit; the naive consumer had acked both already"
	}
	row("consumer crashes", rep.ConsumerCrashes, crashes)
	row("charges in the ledger", rep.LedgerCharges, "ledger rows: one per payment when all is well")
	row("provider charges", rep.ProviderCharges, "charges the payment provider made: one per payment when all is well")
	row("provider replays (same key)", rep.ProviderReplays, "provider calls answered with the earlier charge because the redelivery sent the same derived key: a crash between the call and the commit did not charge twice")
	row("double charges", rep.DoubleCharges, "extra ledger rows and extra provider charges of one payment")
	row("lost messages", rep.Lost, lost)
	row("dead letters", rep.DeadLettered, "messages that could never be processed")
	printReceiptRows(row, rep)
	row("elapsed", fmt.Sprintf("%.2fs", rep.ElapsedS), "")
	row("messages per second", fmt.Sprintf("%.0f", rep.MessagesPerS), "")
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "verdict: %s\n", rep.Verdict)
	return err
}

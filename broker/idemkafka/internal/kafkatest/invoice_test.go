package kafkatest

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"github.com/idem-go/idem/internal/testenv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemkafka"
)

// invoiceCreated is the event of the seed's decision record.
type invoiceCreated struct {
	InvoiceID   string `json:"invoice_id"`
	Customer    string `json:"customer"`
	AmountCents int    `json:"amount_cents"`
}

// TestInvoicesReplayedAfterRebalance is the seed's decision record as a
// test. Context: consumer rebalancing causes invoice events to be processed
// more than once. Decision: record each processed message ID under a unique
// constraint in the same transaction as the side effect. Consequence:
// duplicates are acknowledged without changing state.
//
// The billing service creates an invoice row per InvoiceCreated event. Its
// invoices table deliberately has no unique key on invoice_id, so only the
// Idempotent Consumer stands between a replay and a second invoice. Member A
// creates invoices, and is killed after the transaction of one of them
// committed and before its offset was committed: it leaves the group. A new
// member B joins, the group rebalances, and B is given every partition from
// the last committed offsets: the invoice events A had already turned into
// invoices are replayed to B. Each invoice still exists exactly once, and the
// replays were acknowledged as Duplicates (their offsets committed: a third
// member finds nothing left).
func TestInvoicesReplayedAfterRebalance(t *testing.T) {
	t.Parallel()
	const n = 40
	topic, dead, group := uniqueName("invoice-events"), uniqueName("invoice-events-dead"), uniqueName("billing-service")
	seeds := newCluster(t, topic, dead).ListenAddrs()
	db, store := openSQLite(t)
	if _, err := db.Exec(`CREATE TABLE invoices (invoice_id TEXT NOT NULL, customer TEXT NOT NULL, amount_cents INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	consumer, err := idem.NewConsumer[*sql.Tx](store, idem.Config{Name: "billing-service", PurgeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	createInvoice := func(ctx context.Context, tx *sql.Tx, msg idem.Message) error {
		var ev invoiceCreated
		if err := json.Unmarshal(msg.Payload, &ev); err != nil {
			return idem.Permanent(err)
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO invoices (invoice_id, customer, amount_cents) VALUES (?, ?, ?)`,
			ev.InvoiceID, ev.Customer, ev.AmountCents)
		return err
	}

	// The order service publishes one InvoiceCreated per invoice, with the
	// business key as message ID, keyed by invoice.
	producer := idemkafka.NewProducer(newClient(t, seeds), idemkafka.ProducerConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	for i := range n {
		ev := invoiceCreated{InvoiceID: fmt.Sprintf("INV-%04d", i), Customer: fmt.Sprintf("customer-%d", i%7), AmountCents: 1000 + i}
		payload, _ := json.Marshal(ev)
		if _, err := producer.Publish(ctx, topic, payload, idemkafka.WithMessageID(ev.InvoiceID+"/created"), idemkafka.WithKey([]byte(ev.InvoiceID))); err != nil {
			t.Fatal(err)
		}
	}

	var (
		mu        sync.Mutex
		processed = map[string][]idem.Status{} // by member "A", "B", "C"
	)
	record := func(member string, next idem.Processor, around func(idem.Outcome)) idem.Processor {
		return idem.ProcessorFunc(func(ctx context.Context, msg idem.Message) (idem.Outcome, error) {
			out, err := next.Process(ctx, msg)
			mu.Lock()
			processed[member] = append(processed[member], out.Status)
			mu.Unlock()
			if around != nil {
				around(out)
			}
			return out, err
		})
	}
	statuses := func(member string, s idem.Status) int {
		mu.Lock()
		defer mu.Unlock()
		k := 0
		for _, got := range processed[member] {
			if got == s {
				k++
			}
		}
		return k
	}
	bound := idem.Bind(consumer, createInvoice)

	// Member A is killed right after the transaction of its 10th invoice
	// committed, before the adapter could commit that record's offset.
	killed := make(chan struct{})
	var created atomic.Int32
	var a *member
	aReady := make(chan struct{})
	a = startMember(t, seeds, group, topic, idemkafka.Config{
		Processor: record("A", bound, func(out idem.Outcome) {
			if out.Status == idem.Processed && created.Add(1) == 10 {
				<-aReady
				a.crash()
				close(killed)
			}
		}),
		DeadLetter: dead, Concurrency: 4, RetryDelay: 100 * time.Millisecond,
	})
	close(aReady)
	select {
	case <-killed:
	case <-time.After(waitFor):
		t.Fatalf("member A created %d invoices, never 10", created.Load())
	}
	<-a.runErr // A's handlers in flight have returned

	// B joins the group after the rebalance and is replayed the events.
	b := startMember(t, seeds, group, topic, idemkafka.Config{Processor: record("B", bound, nil), DeadLetter: dead, Concurrency: 4, RetryDelay: 100 * time.Millisecond})
	testenv.Eventually(t, waitFor, fmt.Sprintf("%d invoices", n),
		func() bool { return countRows(t, db, `SELECT COUNT(DISTINCT invoice_id) FROM invoices`) == n },
		func() string {
			return fmt.Sprintf("%d invoices", countRows(t, db, `SELECT COUNT(DISTINCT invoice_id) FROM invoices`))
		})
	testenv.Eventually(t, waitFor, "B's duplicates acknowledged", func() bool { return statuses("B", idem.Duplicate) >= 1 },
		func() string { return fmt.Sprintf("B saw %d duplicates", statuses("B", idem.Duplicate)) })
	// The last invoice can be written while B still holds replayed
	// records (duplicates) it has not handled: wait until every record's
	// offset is committed before stopping B.
	testenv.Eventually(t, waitFor, "every record committed", func() bool { return groupLag(t, seeds, group, topic) == 0 },
		func() string { return fmt.Sprintf("the group's lag is %d", groupLag(t, seeds, group, topic)) })
	if err := b.stop(ctx); err != nil {
		t.Fatalf("stop B: %v", err)
	}

	// Each invoice exists exactly once.
	if got := countRows(t, db, `SELECT COUNT(*) FROM invoices`); got != n {
		t.Errorf("invoices table has %d rows, want exactly %d", got, n)
	}
	if got := countRows(t, db, `SELECT COUNT(*) FROM (SELECT invoice_id FROM invoices GROUP BY invoice_id HAVING COUNT(*) > 1)`); got != 0 {
		t.Errorf("%d invoices were created more than once", got)
	}
	// The replay really happened: B was handed events whose invoices A had
	// created, and acknowledged them as Duplicates without a new row.
	dupsB, newB := statuses("B", idem.Duplicate), statuses("B", idem.Processed)
	if dupsB < 1 {
		t.Errorf("B saw no replayed event; the rebalance story did not happen")
	}
	invoicesByA := statuses("A", idem.Processed)
	if newB+invoicesByA != n {
		t.Errorf("A created %d invoices and B %d new ones: %d, want %d", invoicesByA, newB, newB+invoicesByA, n)
	}
	t.Logf("A created %d invoices before it was killed; B was replayed %d of them (Duplicate) and created the other %d", invoicesByA, dupsB, newB)

	// The duplicates' offsets were committed with the rest: the group has
	// nothing left to deliver.
	if lag := groupLag(t, seeds, group, topic); lag != 0 {
		t.Errorf("the group's lag is %d after B stopped, want 0 (every record committed)", lag)
	}
}

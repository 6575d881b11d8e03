package idemsql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	_ "modernc.org/sqlite" // the pure-Go "sqlite" database/sql driver

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idemsql"
)

// A lease-mode consumer over SQLite, for a side effect outside the
// database: a call to a payment provider. The first attempt charges the
// card (a recovery point records the charge) and then fails before it
// sends the receipt; the redelivery runs as attempt 2, finds the charge
// done and does not charge again; later redeliveries replay the stored
// result.
func Example_leaseConsumer() {
	dir, err := os.MkdirTemp("", "idemsql-lease-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	db, err := sql.Open("sqlite", idemsql.SQLiteDSN(filepath.Join(dir, "app.db")))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()

	store, err := idemsql.New(db, idemsql.SQLite, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	consumer, err := idem.NewLeaseConsumer(store, idem.Config{Name: "receipts", Lease: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer consumer.Close()

	charges := map[string]int{} // the provider's charges, by idempotency key
	errMailer := errors.New("mailer unavailable")
	handler := func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
		charge, err := a.Step(ctx, "charge", func(ctx context.Context) ([]byte, error) {
			charges[a.Key("charge")]++ // the provider dedupes on this key too
			return []byte("ch_42"), nil
		})
		if err != nil {
			return idem.Result{}, err
		}
		if a.Number == 1 {
			return idem.Result{}, errMailer // retryable: the lease is released
		}
		return idem.Result{Body: []byte(`{"charge":"` + string(charge) + `"}`), ContentType: "application/json"}, nil
	}

	msg := idem.Message{ID: "order-42/receipt", Payload: []byte(`{"order":"order-42"}`)}
	for range 3 {
		out, err := consumer.Process(ctx, msg, handler)
		fmt.Printf("%v, attempt %d, result %s, error: %v\n", out.Status, out.Attempt, out.Result, err)
	}
	fmt.Println("charges:", len(charges), "calls:", charges[idem.DeriveKey("receipts", msg.ID, "charge")])

	rec, err := store.Inspect(ctx, "receipts", msg.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("record: %v after %d attempts, last error %q\n", rec.State, rec.Attempt, rec.Error)
	// Output:
	// Failed, attempt 1, result , error: mailer unavailable
	// Processed, attempt 2, result {"charge":"ch_42"}, error: <nil>
	// Duplicate, attempt 0, result {"charge":"ch_42"}, error: <nil>
	// charges: 1 calls: 1
	// record: completed after 2 attempts, last error "mailer unavailable"
}

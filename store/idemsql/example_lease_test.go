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
// database: a webhook delivery. The receiver rejects the payload for good
// (a 400), so the handler marks the error permanent with idem.Permanent:
// the record becomes failed (poison) at once, keeps the error text, and a
// redelivery is not run again but reported as the same failure, for the
// caller to dead-letter.
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
	consumer, err := idem.NewLeaseConsumer(store, idem.Config{Name: "webhooks", Lease: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer consumer.Close()

	calls := 0 // requests the receiver got
	deliver := func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
		calls++
		return idem.Result{}, idem.Permanent(errors.New("receiver said 400: unknown event type"))
	}
	msg := idem.Message{ID: "evt-7", Payload: []byte(`{"type":"order.teleported"}`)}
	for range 2 {
		out, err := consumer.Process(ctx, msg, deliver)
		fmt.Printf("%v (poison %v), dead-letter: %v\n", out.Status, out.Poison, idem.IsPermanent(err))
	}
	fmt.Println("receiver calls:", calls)

	rec, err := store.Inspect(ctx, "webhooks", msg.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("record: %v after %d attempt, last error %q\n", rec.State, rec.Attempt, rec.Error)
	// Output:
	// Failed (poison true), dead-letter: true
	// Failed (poison true), dead-letter: true
	// receiver calls: 1
	// record: failed after 1 attempt, last error "receiver said 400: unknown event type"
}

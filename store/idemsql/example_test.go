package idemsql_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	_ "modernc.org/sqlite" // the pure-Go "sqlite" database/sql driver

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idemsql"
)

// A consumer over SQLite: the handler writes its side effect (a payment
// row) with the transaction that holds the claim, so a redelivery of the
// same message is a Duplicate and the payment is recorded once.
func Example() {
	dir, err := os.MkdirTemp("", "idemsql-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	// WAL, a busy timeout and BEGIN IMMEDIATE transactions; New checks them.
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
	// The application's own table, in the same database.
	if _, err := db.ExecContext(ctx, `CREATE TABLE payments (order_id TEXT NOT NULL, amount_cents INTEGER NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	consumer, err := idem.NewConsumer[*sql.Tx](store, idem.Config{Name: "payments"})
	if err != nil {
		log.Fatal(err)
	}
	defer consumer.Close()

	pay := func(ctx context.Context, tx *sql.Tx, msg idem.Message) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO payments (order_id, amount_cents) VALUES (?, ?)`, "order-42", 1250)
		return err
	}
	msg := idem.Message{ID: "order-42/payment", Payload: []byte(`{"order":"order-42","amount_cents":1250}`)}
	for _, delivery := range []string{"first delivery", "redelivery"} {
		out, err := consumer.Process(ctx, msg, pay)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s: %v\n", delivery, out.Status)
	}

	var payments int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM payments`).Scan(&payments); err != nil {
		log.Fatal(err)
	}
	rec, err := store.Inspect(ctx, "payments", msg.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("payments:", payments)
	fmt.Println("recorded:", rec.MessageID)
	// Output:
	// first delivery: Processed
	// redelivery: Duplicate
	// payments: 1
	// recorded: order-42/payment
}

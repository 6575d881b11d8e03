package idempgxv5_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A lease-mode consumer, for a side effect outside the database: a call to
// a payment provider. The first attempt charges the card (a recovery point
// records the charge) and then fails before it sends the receipt; the
// redelivery runs as attempt 2, finds the charge done and does not charge
// again; later redeliveries replay the stored result. The example runs
// against the PostgreSQL named by IDEM_TEST_POSTGRES_URL, in a schema of
// its own that it drops at the end.
//
// It needs PostgreSQL, so go test compiles it without running it (examples
// have no way to skip); TestExamplesOnServers runs it against the server
// and checks what it prints.
func Example_leaseConsumer() {
	ctx := context.Background()
	url := os.Getenv("IDEM_TEST_POSTGRES_URL")
	if url == "" {
		fmt.Println("IDEM_TEST_POSTGRES_URL is not set: this example needs PostgreSQL")
		return
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()

	// A schema of its own, so that runs of the example do not meet.
	schema := "idem_example_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")

	store, err := idempgxv5.New(pool, &idempgxv5.Config{Table: schema + ".processed"})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := store.Migrate(ctx); err != nil {
		fmt.Println(err)
		return
	}
	consumer, err := idem.NewLeaseConsumer(store, idem.Config{Name: "receipts", Lease: 30 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
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
		fmt.Println(err)
		return
	}
	fmt.Printf("record: %v after %d attempts, last error %q\n", rec.State, rec.Attempt, rec.Error)
}

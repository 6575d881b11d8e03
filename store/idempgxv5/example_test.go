package idempgxv5_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idempgxv5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A consumer that records each order once, however often the broker
// delivers it. The example runs against the PostgreSQL named by
// IDEM_TEST_POSTGRES_URL, in a schema of its own that it drops at the end.
//
// It needs PostgreSQL, so go test compiles it without running it (examples
// have no way to skip); TestExamplesOnServers runs it against the server
// and checks what it prints.
func Example() {
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
	table, orders := schema+".processed", schema+".orders"

	store, err := idempgxv5.New(pool, &idempgxv5.Config{Table: table})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := store.Migrate(ctx); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+orders+" (id text, body text)"); err != nil {
		fmt.Println(err)
		return
	}

	consumer, err := idem.NewConsumer[pgx.Tx](store, idem.Config{Name: "orders"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer consumer.Close()

	// The handler writes its side effect with tx, the transaction that
	// holds the message's claim: both commit, or neither.
	handler := func(ctx context.Context, tx pgx.Tx, msg idem.Message) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+orders+" (id, body) VALUES ($1, $2)", msg.ID, string(msg.Payload))
		return err
	}
	for _, msg := range []idem.Message{
		{ID: "order-1", Payload: []byte(`{"amount":200}`)},
		{ID: "order-1", Payload: []byte(`{"amount":200}`)}, // redelivered
		{ID: "order-1", Payload: []byte(`{"amount":500}`)}, // the ID reused for another payload
	} {
		out, err := consumer.Process(ctx, msg, handler)
		fmt.Println(out.Status, "ack:", out.Ack(), "error:", err != nil)
	}

	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+orders).Scan(&n); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("orders:", n)
}

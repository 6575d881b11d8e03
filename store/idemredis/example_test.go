package idemredis_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idemredis"
	"github.com/redis/go-redis/v9"
)

// A lease-mode consumer on Redis that charges a payment provider. The
// first attempt charges and then fails before it records the receipt; the
// redelivery resumes after the charge (a recovery point) and does not
// charge again; later redeliveries replay the stored receipt, and the ID
// reused with another payload is refused. The example runs against the
// Redis named by IDEM_TEST_REDIS_URL, under a key prefix of its own whose
// keys it deletes at the end.
//
// It needs Redis, so go test compiles it without running it (examples
// have no way to skip); TestExamplesOnServers runs it against the server
// and checks what it prints.
func Example() {
	ctx := context.Background()
	url := os.Getenv("IDEM_TEST_REDIS_URL")
	if url == "" {
		fmt.Println("IDEM_TEST_REDIS_URL is not set: this example needs Redis")
		return
	}
	opts, err := redis.ParseURL(url)
	if err != nil {
		fmt.Println(err)
		return
	}
	client := redis.NewClient(opts)
	defer client.Close()

	prefix := "idem-example:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
	defer func() {
		iter := client.Scan(ctx, 0, prefix+"*", 100).Iterator()
		for iter.Next(ctx) {
			client.Unlink(ctx, iter.Val())
		}
	}()

	store, err := idemredis.New(client, &idemredis.Config{Prefix: prefix})
	if err != nil {
		fmt.Println(err)
		return
	}
	payments, err := idem.NewLeaseConsumer(store, idem.Config{Name: "payments", Lease: 30 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer payments.Close()

	charges := map[string]int{} // the provider's charges, by idempotency key
	handler := func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
		charge, err := a.Step(ctx, "charge", func(ctx context.Context) ([]byte, error) {
			charges[a.Key("charge")]++
			return []byte("ch_1"), nil
		})
		if err != nil {
			return idem.Result{}, err
		}
		if a.Number == 1 {
			return idem.Result{}, errors.New("receipt service unavailable")
		}
		return idem.Result{Body: []byte(`{"charge":"` + string(charge) + `"}`), ContentType: "application/json"}, nil
	}
	for _, msg := range []idem.Message{
		{ID: "pay-1", Payload: []byte(`{"amount":100}`)},
		{ID: "pay-1", Payload: []byte(`{"amount":100}`)}, // redelivered
		{ID: "pay-1", Payload: []byte(`{"amount":100}`)}, // redelivered again
		{ID: "pay-1", Payload: []byte(`{"amount":900}`)}, // the ID reused for another payload
	} {
		out, err := payments.Process(ctx, msg, handler)
		fmt.Printf("%v attempt=%d result=%s ack=%v error=%v\n", out.Status, out.Attempt, out.Result, out.Ack(), err != nil)
	}
	fmt.Println("charges:", len(charges), "calls:", charges[idem.DeriveKey("payments", "pay-1", "charge")])
}

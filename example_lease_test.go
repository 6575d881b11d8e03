package idem_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem"
)

// A lease-mode consumer calls an external payment provider. The first
// attempt charges and then dies before recording the receipt; the
// redelivery takes over after the lease, finds the charge step done
// (a recovery point), and does not charge again.
func ExampleLeaseConsumer_Process() {
	ctx := context.Background()
	store := idem.NewMemoryStore(nil)
	c, _ := idem.NewLeaseConsumer(store, idem.Config{Name: "payments", Lease: time.Minute, PurgeInterval: -1})
	defer c.Close()

	charges := map[string]int{} // the provider's charges, by idempotency key
	crash := errors.New("crashed")
	handler := func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
		chargeID, err := a.Step(ctx, "charge", func(ctx context.Context) ([]byte, error) {
			charges[a.Key("charge")]++
			return []byte("ch_1"), nil
		})
		if err != nil {
			return idem.Result{}, err
		}
		if a.Number == 1 {
			return idem.Result{}, crash // dies before recording the receipt
		}
		return idem.Result{Body: []byte(`{"charge":"` + string(chargeID) + `"}`), ContentType: "application/json"}, nil
	}
	msg := idem.Message{ID: "pay-1", Payload: []byte(`{"amount":100}`)}
	for i := 0; i < 3; i++ {
		out, err := c.Process(ctx, msg, handler)
		fmt.Printf("%s attempt=%d result=%s err=%v\n", out.Status, out.Attempt, out.Result, err != nil)
	}
	fmt.Println("provider charges:", len(charges), "calls:", charges[idem.DeriveKey("payments", "pay-1", "charge")])
	// Output:
	// Failed attempt=1 result= err=true
	// Processed attempt=2 result={"charge":"ch_1"} err=false
	// Duplicate attempt=2 result={"charge":"ch_1"} err=false
	// provider charges: 1 calls: 1
}

package idempgxv5_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/jackc/pgx/v5"
)

// TestBreakPurgePoolOfOne: a Consumer on a pool of ONE connection purges
// while it processes. The purge's lock transaction holds the only
// connection while the purge's statements wait for a second one, which
// never comes: every purge fails after StoreTimeout (ErrStoreTimeout),
// and every Process waits behind it meanwhile. Migrate refuses a pool of
// one with ErrInvalidConfig where it needs two connections; a purge does
// not. Known; IDEM_BREAKIT_KNOWN=1 runs it.
func TestBreakPurgePoolOfOne(t *testing.T) {
	if os.Getenv("IDEM_BREAKIT_KNOWN") == "" {
		t.Skip("known: a purge on a pool of one connection waits for a second one until StoreTimeout; IDEM_BREAKIT_KNOWN=1 runs it")
	}
	ctx := context.Background()
	b := setup(t, poolOpts{maxConns: 1})
	const storeTimeout = 2 * time.Second
	c, err := idem.NewConsumer[pgx.Tx](b.store, idem.Config{Name: "one", PurgeInterval: -1, StoreTimeout: storeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	if out, err := c.Process(ctx, idem.Message{ID: "m-0", Payload: []byte("p")}, b.effectHandler()); err != nil || out.Status != idem.Processed {
		t.Fatalf("Process: %v %v", out.Status, err)
	}
	var (
		wg       sync.WaitGroup
		purgeErr error
		took     time.Duration
	)
	wg.Go(func() {
		start := time.Now()
		_, purgeErr = c.Purge(ctx)
		took = time.Since(start)
	})
	var failed int
	for i := 1; i <= 5; i++ {
		if out, err := c.Process(ctx, idem.Message{ID: fmt.Sprintf("m-%d", i), Payload: []byte("p")}, b.effectHandler()); err != nil || out.Status != idem.Processed {
			failed++
			t.Logf("Process m-%d while the purge runs: %v %v", i, out.Status, err)
		}
	}
	wg.Wait()
	t.Logf("Purge on a pool of one: %v after %v", purgeErr, took)
	if purgeErr != nil || failed > 0 {
		t.Errorf("Purge = %v after %v, %d of 5 messages failed meanwhile; want the purge done (or refused at once) and none failed", purgeErr, took, failed)
	}
}

package idempgxv5_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/idem-go/idem"
)

// TestBreakLockedRoundPoolShared: a locked round holds one of the pool's
// two connections through its publish, and the publish waits until 8
// workers processed 40 messages (each a transaction of its own) on the
// same pool's other connection: the consumers are not starved (every
// message processed once, its effect written once), the round then sends
// every row it claimed, the outbox ends empty and the pool is left clean.
func TestBreakLockedRoundPoolShared(t *testing.T) {
	ctx := context.Background()
	b := setup(t, poolOpts{maxConns: 2})
	const keys, perKey, messages, workers = 4, 1, 40, 8
	rows := emitKeyed(t, b, keys, perKey)
	c := b.consumer(t, "shared")
	publishing, consumed := make(chan struct{}), make(chan struct{})
	var sent int
	r, err := idem.NewRelay(idem.RelayConfig{Store: b.store, Workers: 1, BatchSize: 10, Retention: -1, LockedRounds: true,
		Publisher: idem.PublisherFunc(func(_ context.Context, m []idem.Outgoing) []error {
			close(publishing)
			<-consumed
			sent += len(m)
			return make([]error, len(m))
		})})
	if err != nil {
		t.Fatal(err)
	}
	var round sync.WaitGroup
	var res idem.RelayResult
	round.Go(func() { res, err = r.RunOnce(ctx) })
	<-publishing // the round holds its connection from here to its commit
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < messages; i += workers {
				id := fmt.Sprintf("m-%03d", i)
				if out, err := c.Process(ctx, idem.Message{ID: id, Payload: []byte("p")}, b.effectHandler()); out.Status != idem.Processed {
					t.Errorf("%s: %v %v; want processed while the round holds a connection", id, out.Status, err)
				}
			}
		})
	}
	wg.Wait()
	close(consumed)
	round.Wait()
	if err != nil || res.Sent != len(rows) || sent != len(rows) {
		t.Errorf("RunOnce = %+v, %v, %d published; want all %d sent", res, err, sent, len(rows))
	}
	for i := range messages {
		if n := b.countEffects(t, fmt.Sprintf("m-%03d", i)); n != 1 {
			t.Errorf("m-%03d: %d effects, want 1", i, n)
		}
	}
	if n := b.countRecords(t, "shared"); n != messages {
		t.Errorf("%d records, want %d", n, messages)
	}
	b.wantPendingRows(t, ctx, 0)
	checkPool(t, b.pool)
}

package idem_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// slowPurgeStore is sentClaimer (a store that ends a round's rows with its
// next claim) whose first outbox purge takes slow (fake time): a purge of
// a large backlog of kept rows, batch after batch.
type slowPurgeStore struct {
	*sentClaimer
	slow   time.Duration
	purges int
}

func (s *slowPurgeStore) PurgeOutbox(ctx context.Context, p *idemdriver.PurgeOutboxParams) (int64, error) {
	s.mu.Lock()
	s.purges++
	first := s.purges == 1
	s.mu.Unlock()
	if first {
		time.Sleep(s.slow)
	}
	return s.MemoryStore.PurgeOutbox(ctx, p)
}

// TestBreakRelayPurgeWhileHolding: a relay worker that purges holds the
// confirmed rows of its last round until its next claim; a purge that
// runs between the two (one that outlasts the lease: a large backlog of
// rows past their retention) must not leave those rows in place until
// their lease ends, for another relay to send again although the broker
// confirmed them and no relay died: the row goes out once.
func TestBreakRelayPurgeWhileHolding(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		const lease = time.Second
		store := &slowPurgeStore{sentClaimer: &sentClaimer{MemoryStore: idem.NewMemoryStore(nil)}, slow: 3 * lease}
		tx, err := store.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := store.EmitTx(ctx, tx, &idemdriver.EmitParams{Consumer: "c", Messages: []idemdriver.OutgoingRecord{{ID: "k1", Destination: "d", Key: "k", Payload: []byte("1")}}}); err != nil {
			t.Fatal(err)
		}
		if err := store.Commit(ctx, tx); err != nil {
			t.Fatal(err)
		}
		var (
			mu   sync.Mutex
			sent = map[string][]string{}
		)
		pub := func(name string) idem.Publisher {
			return idem.PublisherFunc(func(_ context.Context, m []idem.Outgoing) []error {
				mu.Lock()
				defer mu.Unlock()
				for _, o := range m {
					sent[o.ID] = append(sent[o.ID], name)
				}
				return make([]error, len(m))
			})
		}
		relay := func(name string, retention time.Duration) *idem.Relay {
			r, err := idem.NewRelay(idem.RelayConfig{Store: store, Publisher: pub(name), Workers: 1, Lease: lease, Retention: retention, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		rctx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); _ = relay("A", time.Hour).Run(rctx) }()
		synctest.Wait() // A published k1 and purges
		wg.Add(1)
		go func() { defer wg.Done(); _ = relay("B", -1).Run(rctx) }()
		time.Sleep(5 * lease)
		synctest.Wait()
		stop()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		if len(sent["k1"]) != 1 {
			t.Errorf("k1 published by %v; want once: the broker confirmed it and no relay died", sent["k1"])
		}
		if st, err := store.OutboxStats(ctx); err != nil || st.Pending != 0 {
			t.Errorf("OutboxStats = %+v, %v; want none pending", st, err)
		}
	})
}

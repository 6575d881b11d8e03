package idem_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// sentClaimer is the memory store with idemdriver.OutboxSentClaimer
// (MarkSent, then ClaimOutgoing), counting the calls of each kind.
type sentClaimer struct {
	*idem.MemoryStore
	mu                  sync.Mutex
	claims, marks, both int
	ended               []string // the IDs MarkSentClaim ended, in order
	failEnding          int      // MarkSentClaims ending rows to fail, changing nothing
}

func (s *sentClaimer) ClaimOutgoing(ctx context.Context, p *idemdriver.ClaimOutgoingParams) ([]idemdriver.OutgoingRecord, error) {
	s.mu.Lock()
	s.claims++
	s.mu.Unlock()
	return s.MemoryStore.ClaimOutgoing(ctx, p)
}

func (s *sentClaimer) MarkSent(ctx context.Context, p *idemdriver.MarkSentParams) error {
	s.mu.Lock()
	s.marks++
	s.mu.Unlock()
	return s.MemoryStore.MarkSent(ctx, p)
}

func (s *sentClaimer) MarkSentClaim(ctx context.Context, sent *idemdriver.MarkSentParams, claim *idemdriver.ClaimOutgoingParams) ([]idemdriver.OutgoingRecord, error) {
	s.mu.Lock()
	s.both++
	if len(sent.IDs) > 0 && s.failEnding > 0 {
		s.failEnding--
		s.mu.Unlock()
		return nil, errDeadlock
	}
	s.ended = append(s.ended, sent.IDs...)
	s.mu.Unlock()
	if err := s.MemoryStore.MarkSent(ctx, sent); err != nil {
		return nil, err
	}
	return s.MemoryStore.ClaimOutgoing(ctx, claim)
}

// calls returns the counts: plain claims, plain marks, MarkSentClaims.
func (s *sentClaimer) calls() (int, int, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.claims, s.marks, s.both
}

// With a store that ends and claims in one call, each round of Run ends
// the previous round's confirmed rows with its claim: rows of one key go
// out in order, one round each, with one store call per round; a round's
// hook event comes once its rows are ended; rows held when Run stops are
// ended then.
func TestRelayRunEndsRowsWithTheNextClaim(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		store := &sentClaimer{MemoryStore: idem.NewMemoryStore(nil)}
		emit := func(ids ...string) {
			t.Helper()
			tx, err := store.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var rows []idemdriver.OutgoingRecord
			for _, id := range ids {
				rows = append(rows, idemdriver.OutgoingRecord{ID: id, Destination: "d", Key: "k", Payload: []byte(id)})
			}
			if err := store.EmitTx(ctx, tx, &idemdriver.EmitParams{Consumer: "c", Messages: rows}); err != nil {
				t.Fatal(err)
			}
			if err := store.Commit(ctx, tx); err != nil {
				t.Fatal(err)
			}
		}
		emit("k1", "k2", "k3")
		var (
			mu     sync.Mutex
			sent   []string
			events []idem.RelayResult
			stop   context.CancelFunc
		)
		pub := idem.PublisherFunc(func(_ context.Context, m []idem.Outgoing) []error {
			mu.Lock()
			defer mu.Unlock()
			for _, o := range m {
				sent = append(sent, o.ID)
				if o.ID == "last" {
					stop() // Run stops holding this round's row
				}
			}
			return make([]error, len(m))
		})
		hook := relayEvents(func(e idem.RelayEvent) {
			mu.Lock()
			defer mu.Unlock()
			if e.Err != nil {
				t.Errorf("relay event error: %v", e.Err)
			}
			events = append(events, e.Result)
		})
		r, err := idem.NewRelay(idem.RelayConfig{Store: store, Publisher: pub, Workers: 1, Retention: -1, Hooks: []idem.Hook{hook}})
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		stop = cancel
		done := make(chan struct{})
		go func() { defer close(done); _ = r.Run(rctx) }()
		synctest.Wait() // idle: every row sent, waiting for a wake or a poll

		claims, marks, both := store.calls()
		mu.Lock()
		if !slices.Equal(sent, []string{"k1", "k2", "k3"}) {
			t.Errorf("sent %v, want k1, k2, k3 in order", sent)
		}
		if claims != 1 || marks != 0 || both != 3 {
			t.Errorf("%d claims, %d marks, %d MarkSentClaims; want 1 claim (the first round), no mark, and 3 (each ending a round's row, the last claiming none)", claims, marks, both)
		}
		if len(events) != 3 || events[0] != (idem.RelayResult{Claimed: 1, Sent: 1}) || events[2] != (idem.RelayResult{Claimed: 1, Sent: 1}) {
			t.Errorf("relay events %+v, want 3 of one row claimed and sent", events)
		}
		mu.Unlock()
		if !slices.Equal(store.ended, []string{"k1", "k2", "k3"}) {
			t.Errorf("MarkSentClaim ended %v, want k1, k2, k3", store.ended)
		}
		if st, err := store.OutboxStats(ctx); err != nil || st.Pending != 0 {
			t.Errorf("OutboxStats = %+v, %v; want none pending", st, err)
		}

		// Run stops after a publish: the row it holds is ended then.
		emit("last")
		r.Wake()
		<-done
		claims, marks, _ = store.calls()
		if claims != 2 || marks != 1 {
			t.Errorf("after the stop: %d claims, %d marks; want 2 and 1 (the held row ended by MarkSent)", claims, marks)
		}
		if st, err := store.OutboxStats(ctx); err != nil || st.Pending != 0 {
			t.Errorf("OutboxStats after the stop = %+v, %v; want none pending", st, err)
		}
		mu.Lock()
		if len(events) != 4 || events[3] != (idem.RelayResult{Claimed: 1, Sent: 1}) {
			t.Errorf("relay events %+v, want a fourth of one row claimed and sent", events)
		}
		mu.Unlock()
	})
}

type relayEvents func(idem.RelayEvent)

func (f relayEvents) OnRelay(_ context.Context, e idem.RelayEvent) { f(e) }

// errDeadlock stands for a store's refused transaction (MariaDB's error
// 1213): nothing it wrote stays.
var errDeadlock = errors.New("deadlock found when trying to get lock")

// When the call that ends a round's confirmed rows with the next claim
// fails (its transaction rolled back), the rows are ended alone, not
// dropped: none is published again once its lease ends.
func TestRelayRunEndsHeldRowsWhenTheirClaimFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		store := &sentClaimer{MemoryStore: idem.NewMemoryStore(nil), failEnding: 1}
		tx, err := store.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var rows []idemdriver.OutgoingRecord
		for _, id := range []string{"a1", "b1", "c1"} {
			rows = append(rows, idemdriver.OutgoingRecord{ID: id, Destination: "d", Key: id[:1], Payload: []byte(id)})
		}
		if err := store.EmitTx(ctx, tx, &idemdriver.EmitParams{Consumer: "c", Messages: rows}); err != nil {
			t.Fatal(err)
		}
		if err := store.Commit(ctx, tx); err != nil {
			t.Fatal(err)
		}
		var (
			mu   sync.Mutex
			sent = map[string]int{}
		)
		pub := idem.PublisherFunc(func(_ context.Context, m []idem.Outgoing) []error {
			mu.Lock()
			defer mu.Unlock()
			for _, o := range m {
				sent[o.ID]++
			}
			return make([]error, len(m))
		})
		r, err := idem.NewRelay(idem.RelayConfig{Store: store, Publisher: pub, Workers: 1, Retention: -1, BatchSize: 1})
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = r.Run(rctx) }()
		synctest.Wait()
		time.Sleep(3 * idem.DefaultRelayLease) // past every lease: a dropped row would go out again
		synctest.Wait()
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, id := range []string{"a1", "b1", "c1"} {
			if sent[id] != 1 {
				t.Errorf("%s published %d times, want once", id, sent[id])
			}
		}
		if _, marks, _ := store.calls(); marks == 0 {
			t.Errorf("no MarkSent after the failed MarkSentClaim: the held row was not ended alone")
		}
		if st, err := store.OutboxStats(ctx); err != nil || st.Pending != 0 {
			t.Errorf("OutboxStats = %+v, %v; want none pending", st, err)
		}
	})
}

package idempgxv5_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/jackc/pgx/v5"
)

// TestBreakLockedRelayPoolOfOne: Relay.Run with LockedRounds (two
// workers, and its LISTEN, which takes a connection of the pool for good)
// and a Consumer that emits and wakes that relay share a pool of ONE
// connection, 8 goroutines processing 64 messages: a locked round holds
// the connection through its publish, the other worker and every
// Process wait for it. Nothing may deadlock or starve: every message is
// processed once (one effect), every outgoing message published exactly
// once, per key in seq order, the outbox ends empty and the pool clean.
func TestBreakLockedRelayPoolOfOne(t *testing.T) {
	ctx := context.Background()
	b := setup(t, poolOpts{maxConns: 1})
	const messages, workers, keys = 64, 8, 4
	var (
		mu  sync.Mutex
		log []idem.Outgoing
	)
	r, err := idem.NewRelay(idem.RelayConfig{Store: b.store, Workers: 2, BatchSize: 5, Retention: -1, LockedRounds: true,
		MinPoll: 10 * time.Millisecond, MaxPoll: 100 * time.Millisecond,
		Publisher: idem.PublisherFunc(func(_ context.Context, m []idem.Outgoing) []error {
			mu.Lock()
			log = append(log, m...)
			mu.Unlock()
			return make([]error, len(m))
		})})
	if err != nil {
		t.Fatal(err)
	}
	c, err := idem.NewConsumer[pgx.Tx](b.store, idem.Config{Name: "one", PurgeInterval: -1, Relay: r})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	var run sync.WaitGroup
	run.Go(func() { _ = r.Run(rctx) })
	defer func() { stop(); run.Wait() }()

	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < messages; i += workers {
				id := fmt.Sprintf("m-%03d", i)
				out, err := c.Process(ctx, idem.Message{ID: id, Payload: []byte("p")}, func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
					if err := b.writeEffect(ctx, tx, m.ID); err != nil {
						return err
					}
					_, err := idem.Emit(ctx, idem.OutgoingMessage{Destination: "d", Key: fmt.Sprintf("k%d", i%keys), Payload: []byte(m.ID)})
					return err
				})
				if err != nil || out.Status != idem.Processed {
					t.Errorf("%s: %v %v; want processed", id, out.Status, err)
				}
			}
		})
	}
	wg.Wait()
	published := func() int { mu.Lock(); defer mu.Unlock(); return len(log) }
	testenv.Eventually(t, 60*time.Second, "every outgoing message published", func() bool { return published() >= messages }, func() string {
		return fmt.Sprintf("%d of %d published", published(), messages)
	})
	stop()
	run.Wait()
	_ = c.Close()

	for i := range messages {
		if n := b.countEffects(t, fmt.Sprintf("m-%03d", i)); n != 1 {
			t.Errorf("m-%03d: %d effects, want 1", i, n)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	seen := map[string]int{}
	for _, o := range log {
		seen[o.ID]++
	}
	if len(log) != messages || len(seen) != messages {
		t.Errorf("%d publications of %d rows; want each of %d once", len(log), len(seen), messages)
	}
	seqsInKeyOrder(t, log)
	b.wantPendingRows(t, ctx, 0)
	checkPool(t, b.pool)
}

// seqsInKeyOrder checks that, per key, the first publications of log
// are in seq order.
func seqsInKeyOrder(t *testing.T, log []idem.Outgoing) {
	t.Helper()
	last := map[string]int64{}
	seen := map[string]bool{}
	for _, m := range log {
		if seen[m.ID] {
			continue
		}
		seen[m.ID] = true
		if prev, ok := last[m.Key]; ok && prev >= m.Seq {
			t.Errorf("key %s: seq %d published first after seq %d", m.Key, m.Seq, prev)
		}
		last[m.Key] = m.Seq
	}
}

// TestBreakLockedAndLeasedRunsFailing: a relay with locked rounds and one
// with leased rounds, each running Relay.Run with 3 workers on one
// outbox (8 keys × 12 rows), through publishers that fail some rows: a
// third of them (by a hash of the ID) fail at their first attempt and
// succeed at the second, one in eleven fails for good. Per key, a row
// may go out only once the previous one was confirmed or failed for good;
// each row is confirmed exactly once (those failing first, at their
// second attempt, at which they say so), the permanent ones are
// published once and end failed, and nothing stays pending.
func TestBreakLockedAndLeasedRunsFailing(t *testing.T) {
	ctx := context.Background()
	b := setup(t, poolOpts{maxConns: 8})
	const keys, perKey = 8, 12
	rows := emitKeyed(t, b, keys, perKey)
	fate := func(id string) string {
		h := fnv.New32a()
		h.Write([]byte(id))
		switch v := h.Sum32(); {
		case v%11 == 0:
			return "permanent"
		case v%3 == 0:
			return "retry"
		}
		return "ok"
	}
	type event struct {
		o   idem.Outgoing
		ok  bool // confirmed
		end bool // confirmed or failed for good
	}
	var (
		mu     sync.Mutex
		events []event
		by     = map[bool]int{}
	)
	relay := func(locked bool) *idem.Relay {
		r, err := idem.NewRelay(idem.RelayConfig{Store: b.store, Workers: 3, BatchSize: 4, Retention: -1, LockedRounds: locked,
			MinPoll: 5 * time.Millisecond, MaxPoll: 20 * time.Millisecond, MinRetry: 10 * time.Millisecond, MaxRetry: 20 * time.Millisecond,
			Publisher: idem.PublisherFunc(func(_ context.Context, m []idem.Outgoing) []error {
				mu.Lock()
				defer mu.Unlock()
				errs := make([]error, len(m))
				for i, o := range m {
					switch f := fate(o.ID); {
					case f == "permanent":
						errs[i] = idem.Permanent(errors.New("refused"))
					case f == "retry" && o.Attempts == 1:
						errs[i] = errors.New("try again")
					}
					events = append(events, event{o: o, ok: errs[i] == nil, end: errs[i] == nil || errors.Is(errs[i], idem.ErrPermanent)})
					by[locked]++
				}
				return errs
			})})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	rctx, stop := context.WithCancel(ctx)
	var run sync.WaitGroup
	for _, locked := range []bool{true, false} {
		r := relay(locked)
		run.Go(func() { _ = r.Run(rctx) })
	}
	stats := func() string {
		st, err := b.store.OutboxStats(ctx)
		return fmt.Sprintf("%+v %v", st, err)
	}
	testenv.Eventually(t, 60*time.Second, "every row ended", func() bool {
		st, err := b.store.OutboxStats(ctx)
		return err == nil && st.Pending == 0
	}, stats)
	stop()
	run.Wait()

	mu.Lock()
	defer mu.Unlock()
	okCount, pubCount := map[string]int{}, map[string]int{}
	ended := map[string]bool{}
	for _, e := range events {
		pubCount[e.o.ID]++
		if e.ok {
			okCount[e.o.ID]++
		}
	}
	// Per key, a row goes out only after the previous row ended.
	prev := map[string]string{} // key -> the last row that went out
	for _, e := range events {
		if p, ok := prev[e.o.Key]; ok && p != e.o.ID && !ended[p] {
			t.Errorf("key %s: %s went out before %s ended", e.o.Key, e.o.ID, p)
		}
		prev[e.o.Key] = e.o.ID
		if e.end {
			ended[e.o.ID] = true
		}
	}
	var permanent int64
	for _, row := range rows {
		switch fate(row.ID) {
		case "permanent":
			permanent++
			if pubCount[row.ID] != 1 || okCount[row.ID] != 0 {
				t.Errorf("%s (fails for good): published %d times, confirmed %d; want once, never", row.ID, pubCount[row.ID], okCount[row.ID])
			}
		case "retry":
			if pubCount[row.ID] != 2 || okCount[row.ID] != 1 {
				t.Errorf("%s (fails once): published %d times, confirmed %d; want twice, once", row.ID, pubCount[row.ID], okCount[row.ID])
			}
		default:
			if pubCount[row.ID] != 1 || okCount[row.ID] != 1 {
				t.Errorf("%s: published %d times, confirmed %d; want once", row.ID, pubCount[row.ID], okCount[row.ID])
			}
		}
	}
	st, err := b.store.OutboxStats(ctx)
	if err != nil || st.Pending != 0 || st.Failed != permanent {
		t.Errorf("outbox at the end: %+v, %v; want none pending, %d failed", st, err, permanent)
	}
	t.Logf("%d rows, %d failing for good; publications by the locked relay %d, by the leased one %d", len(rows), permanent, by[true], by[false])
	checkPool(t, b.pool)
}

// TestBreakLockedRoundPoolExhausted: every connection of the pool is held
// elsewhere (here, by the test) when a relay round starts. A leased
// round's claim gives up after 10s with an error matching
// ErrStoreTimeout, as RunOnce documents; so must a locked round, whose
// LockedRound acquired its connection under the caller's context alone
// before (RunOnce then waited for as long as the pool stayed exhausted).
// Both cases run at once (about 10s).
func TestBreakLockedRoundPoolExhausted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, poolOpts{maxConns: 1})
	emitKeyed(t, b, 1, 1)
	held, err := b.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(held.Release) // after the parallel subtests
	for _, locked := range []bool{false, true} {
		t.Run(fmt.Sprintf("locked=%v", locked), func(t *testing.T) {
			t.Parallel()
			r, err := idem.NewRelay(idem.RelayConfig{Store: b.store, Workers: 1, Retention: -1, LockedRounds: locked,
				Publisher: idem.PublisherFunc(func(_ context.Context, m []idem.Outgoing) []error { return make([]error, len(m)) })})
			if err != nil {
				t.Fatal(err)
			}
			// 20s: twice the bound RunOnce documents.
			rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			start := time.Now()
			_, err = r.RunOnce(rctx)
			took := time.Since(start)
			t.Logf("RunOnce with the pool exhausted: %v after %v", err, took)
			if !errors.Is(err, idem.ErrStoreTimeout) || rctx.Err() != nil {
				t.Errorf("RunOnce = %v after %v; want ErrStoreTimeout within its 10s bound", err, took)
			}
		})
	}
}

// TestBreakLockedRoundBoundDoesNotLeak: a locked round bounds its own
// transaction with idle_in_transaction_session_timeout = Lease (20ms
// here). On a pool of one connection, after a round that sent its rows
// (committed), one that found nothing (rolled back) and one whose end
// failed (a failed row the store refuses: rolled back), a Consumer's
// transaction on that same connection idles 300ms inside its handler:
// the bound must have ended with each round's transaction, so the
// message is processed. Directly and through PgBouncer in transaction
// pooling (both exec modes).
func TestBreakLockedRoundBoundDoesNotLeak(t *testing.T) {
	t.Run("direct", func(t *testing.T) { lockedBoundNoLeak(t, poolOpts{maxConns: 1}) })
	for _, mode := range bouncerModes {
		t.Run(fmt.Sprintf("pgbouncer-%v", mode), func(t *testing.T) {
			lockedBoundNoLeak(t, poolOpts{maxConns: 1, mode: mode, url: bouncerURL(t)})
		})
	}
}

func lockedBoundNoLeak(t *testing.T, o poolOpts) {
	ctx := context.Background()
	b := setup(t, o)
	emitKeyed(t, b, 2, 2)
	r, err := idem.NewRelay(idem.RelayConfig{Store: b.store, Workers: 1, Retention: -1, LockedRounds: true, Lease: 20 * time.Millisecond,
		Publisher: idem.PublisherFunc(func(_ context.Context, m []idem.Outgoing) []error { return make([]error, len(m)) })})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 { // two rounds that send, one that finds nothing
		if _, err := r.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	b.wantPendingRows(t, ctx, 0)
	// A round whose end fails: its Publish names a row failed at attempt
	// 0, which the store refuses (ErrInvalidConfig) after the claim.
	emitKeyed(t, b, 1, 1)
	n, err := b.store.LockedRound(ctx, &idemdriver.LockedRoundParams{Limit: 10, Lease: 20 * time.Millisecond,
		Publish: func(_ context.Context, recs []idemdriver.OutgoingRecord) (idemdriver.MarkSentParams, []idemdriver.FailedRow) {
			return idemdriver.MarkSentParams{}, []idemdriver.FailedRow{{ID: recs[0].ID, Seq: recs[0].Seq, Attempt: 0, Error: "e"}}
		}})
	t.Logf("the round whose end fails: %d rows, %v", n, err)
	if err == nil {
		t.Fatal("a failed row at attempt 0 was accepted")
	}
	c := b.consumer(t, "after")
	out, err := c.Process(ctx, idem.Message{ID: "m-1", Payload: []byte("p")}, func(ctx context.Context, tx pgx.Tx, m idem.Message) error {
		if err := b.writeEffect(ctx, tx, m.ID); err != nil {
			return err
		}
		time.Sleep(300 * time.Millisecond) // idle in the transaction, far past the rounds' bound
		return nil
	})
	if err != nil || out.Status != idem.Processed {
		t.Fatalf("Process after the rounds: %v %v; want processed (a round's idle bound outlived its transaction?)", out.Status, err)
	}
	if n := b.countEffects(t, "m-1"); n != 1 {
		t.Errorf("%d effects, want 1", n)
	}
	checkPool(t, b.pool)
}

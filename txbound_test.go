package idem_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// sqlLikeStore is a MemoryStore whose transactions are tied to the
// context they began with, as database/sql's are: Begin derives a context
// from it, a transaction is rolled back when that context ends, Commit
// refuses a transaction whose context ended with that context's error
// (context.Canceled, whatever ended its parent) and commits under it, and
// Commit and Rollback end it. The call named by stall blocks until its
// context ends, as on a connection that stopped answering. Rollback
// records what it saw of its context.
type sqlLikeStore struct {
	*idem.MemoryStore
	mu        sync.Mutex
	stall     string
	txs       map[*idem.MemoryTx]sqlLikeTx
	derived   []context.Context // every transaction's, in order
	rollbacks []rollbackSeen
}

type sqlLikeTx struct {
	ctx    context.Context
	cancel context.CancelFunc
}

// rollbackSeen is what a Rollback saw of its context when it was called.
type rollbackSeen struct {
	err      error
	deadline time.Time
	ok       bool
}

func newSQLLikeStore() *sqlLikeStore {
	return &sqlLikeStore{MemoryStore: idem.NewMemoryStore(nil), txs: map[*idem.MemoryTx]sqlLikeTx{}}
}

func (s *sqlLikeStore) setStall(op string) {
	s.mu.Lock()
	s.stall = op
	s.mu.Unlock()
}

// wait blocks until ctx ends when op stalls.
func (s *sqlLikeStore) wait(ctx context.Context, op string) error {
	s.mu.Lock()
	stall := s.stall == op
	s.mu.Unlock()
	if !stall {
		return nil
	}
	<-ctx.Done()
	return ctx.Err()
}

func (s *sqlLikeStore) Begin(ctx context.Context) (*idem.MemoryTx, error) {
	if err := s.wait(ctx, "begin"); err != nil {
		return nil, err
	}
	tx, err := s.MemoryStore.Begin(ctx)
	if err != nil {
		return nil, err
	}
	tctx, cancel := context.WithCancel(ctx)
	context.AfterFunc(tctx, func() { _ = s.MemoryStore.Rollback(context.Background(), tx) })
	s.mu.Lock()
	s.txs[tx] = sqlLikeTx{tctx, cancel}
	s.derived = append(s.derived, tctx)
	s.mu.Unlock()
	return tx, nil
}

func (s *sqlLikeStore) ClaimTx(ctx context.Context, tx *idem.MemoryTx, p *idemdriver.ClaimParams) (idemdriver.ClaimResult, error) {
	if err := s.wait(ctx, "claim"); err != nil {
		return idemdriver.ClaimResult{}, err
	}
	return s.MemoryStore.ClaimTx(ctx, tx, p)
}

// take returns tx's derived context and forgets it.
func (s *sqlLikeStore) take(tx *idem.MemoryTx) sqlLikeTx {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.txs[tx]
	delete(s.txs, tx)
	return t
}

func (s *sqlLikeStore) Commit(_ context.Context, tx *idem.MemoryTx) error {
	t := s.take(tx)
	defer t.cancel()
	if err := t.ctx.Err(); err != nil {
		return err
	}
	if err := s.wait(t.ctx, "commit"); err != nil {
		return err
	}
	return s.MemoryStore.Commit(t.ctx, tx)
}

func (s *sqlLikeStore) Rollback(ctx context.Context, tx *idem.MemoryTx) error {
	dl, ok := ctx.Deadline()
	s.mu.Lock()
	s.rollbacks = append(s.rollbacks, rollbackSeen{err: ctx.Err(), deadline: dl, ok: ok})
	s.mu.Unlock()
	if t := s.take(tx); t.cancel != nil {
		defer t.cancel()
	}
	if err := s.wait(ctx, "rollback"); err != nil {
		return err
	}
	return s.MemoryStore.Rollback(ctx, tx)
}

// lastRollback returns what the last Rollback saw.
func (s *sqlLikeStore) lastRollback(t *testing.T) rollbackSeen {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.rollbacks) == 0 {
		t.Fatal("no Rollback was called")
	}
	return s.rollbacks[len(s.rollbacks)-1]
}

// everyTxEnded fails t unless the context derived for each transaction so
// far has ended: no transaction is left open, or registered with the
// contexts the Consumer reuses.
func (s *sqlLikeStore) everyTxEnded(t *testing.T, when string) {
	t.Helper()
	synctest.Wait() // the AfterFunc rollbacks
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, c := range s.derived {
		if c.Err() == nil {
			t.Errorf("%s: the context of transaction %d has not ended", when, i+1)
		}
	}
	if len(s.txs) != 0 {
		t.Errorf("%s: %d transactions neither committed nor rolled back", when, len(s.txs))
	}
}

func newTxConsumer(t *testing.T, s idemdriver.TxStore[*idem.MemoryTx], storeTimeout time.Duration) *idem.Consumer[*idem.MemoryTx] {
	t.Helper()
	c, err := idem.NewConsumer(s, idem.Config{Name: "c", PurgeInterval: -1, StoreTimeout: storeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func noopHandler(context.Context, *idem.MemoryTx, idem.Message) error { return nil }

// wantProcess processes id under ctx and fails t unless the outcome has
// status and an error matching match (nil: no error).
func wantProcess(t *testing.T, c *idem.Consumer[*idem.MemoryTx], ctx context.Context, what, id string, h idem.Handler[*idem.MemoryTx], status idem.Status, match error) error {
	t.Helper()
	out, err := c.Process(ctx, idem.Message{ID: id, Payload: []byte("p")}, h)
	if out.Status != status || (match == nil) != (err == nil) || (match != nil && !errors.Is(err, match)) {
		t.Fatalf("%s: %v (%v), want %v matching %v", what, out.Status, err, status, match)
	}
	return err
}

// The contexts and timer a Consumer gives one transaction's store calls
// are reused by the next transactions, which end as before: committed,
// rolled back on a duplicate and on a handler error, each transaction's
// context ended; a commit that stalls ends at the store timeout, and the
// transactions after it, batches included, are not cut short.
func TestTxContextsReused(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := newSQLLikeStore()
		c := newTxConsumer(t, s, 2*time.Second)
		ctx := t.Context()
		failing := errors.New("handler failed")
		for round := 1; round <= 3; round++ {
			id := func(s string) string { return fmt.Sprintf("%s-%d", s, round) }
			wantProcess(t, c, ctx, "new", id("m"), noopHandler, idem.Processed, nil)
			wantProcess(t, c, ctx, "duplicate", id("m"), noopHandler, idem.Duplicate, nil)
			wantProcess(t, c, ctx, "handler error", id("f"), func(context.Context, *idem.MemoryTx, idem.Message) error { return failing }, idem.Failed, failing)

			s.setStall("commit")
			start := time.Now()
			wantProcess(t, c, ctx, "stalled commit", id("s"), noopHandler, idem.Failed, idem.ErrStoreTimeout)
			if took := time.Since(start); took != 2*time.Second {
				t.Errorf("round %d: the stalled commit returned after %v, want the store timeout (2s)", round, took)
			}
			s.setStall("")
			wantProcess(t, c, ctx, "after the stalled commit", id("s"), func(ctx context.Context, _ *idem.MemoryTx, _ idem.Message) error {
				time.Sleep(3 * time.Second) // the handler's own work is not bounded by the store timeout
				return ctx.Err()
			}, idem.Processed, nil)

			outs, err := c.ProcessBatch(ctx, []idem.Message{{ID: id("b1"), Payload: []byte("p")}, {ID: id("m"), Payload: []byte("p")}}, func(context.Context, *idem.MemoryTx, []idem.Message) error { return nil })
			if err != nil || outs[0].Status != idem.Processed || outs[1].Status != idem.Duplicate {
				t.Fatalf("round %d: batch: %v, %v (%v), want Processed, Duplicate", round, outs[0].Status, outs[1].Status, err)
			}
			s.everyTxEnded(t, fmt.Sprintf("round %d", round))
			if n := idem.CountRecords(s.MemoryStore, "c"); n != 3*round {
				t.Fatalf("round %d: %d records, want %d", round, n, 3*round)
			}
		}
	})
}

// A caller's context that ends during a store call ends the call (the
// store timeout is an hour), and the transaction is rolled back under a
// context the caller's cancellation did not end, bounded by the store
// timeout. The next delivery, under a context of its own, is processed.
func TestTxCallerCancelledDuringStoreCall(t *testing.T) {
	t.Parallel()
	for _, op := range []string{"begin", "claim", "commit"} {
		t.Run(op, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newSQLLikeStore()
				c := newTxConsumer(t, s, time.Hour)
				ctx, cancel := context.WithCancel(t.Context())
				s.setStall(op)
				done := make(chan error, 1)
				start := time.Now()
				go func() {
					out, err := c.Process(ctx, idem.Message{ID: "m", Payload: []byte("p")}, noopHandler)
					if out.Status != idem.Failed {
						err = fmt.Errorf("status %v (%w), want Failed", out.Status, err)
					}
					done <- err
				}()
				synctest.Wait() // the call stalls
				cancel()
				err := <-done
				if !errors.Is(err, context.Canceled) || errors.Is(err, idem.ErrStoreTimeout) {
					t.Errorf("Process whose %s stalls, its context cancelled: %v, want an error matching context.Canceled and not ErrStoreTimeout", op, err)
				}
				if took := time.Since(start); took != 0 {
					t.Errorf("Process returned %v after the cancellation, want at once", took)
				}
				if op == "claim" {
					r := s.lastRollback(t)
					if r.err != nil || !r.ok || r.deadline.Sub(start) != time.Hour {
						t.Errorf("Rollback's context: err %v, deadline %v (%v): want a live context ending at the store timeout (1h)", r.err, r.deadline.Sub(start), r.ok)
					}
				}
				s.setStall("")
				s.everyTxEnded(t, "after the cancellation")
				wantProcess(t, c, t.Context(), "redelivery", "m", noopHandler, idem.Processed, nil)
				s.everyTxEnded(t, "after the redelivery")
				if n := idem.CountRecords(s.MemoryStore, "c"); n != 1 {
					t.Errorf("%d records, want 1", n)
				}
			})
		})
	}
}

// A caller whose deadline passes while the handler runs: the transaction,
// tied to the store calls' context, is rolled back, and Commit's error
// (context.Canceled, as database/sql reports it) says the caller's
// deadline passed.
func TestTxCallerDeadlinePassesInHandler(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := newSQLLikeStore()
		c := newTxConsumer(t, s, 10*time.Second)
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		slow := func(context.Context, *idem.MemoryTx, idem.Message) error {
			time.Sleep(2 * time.Second)
			return nil // a handler that does not look at its context
		}
		err := wantProcess(t, c, ctx, "deadline passed in the handler", "m", slow, idem.Failed, idem.ErrStore)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("deadline passed in the handler: %v, want an error matching context.DeadlineExceeded", err)
		}
		s.everyTxEnded(t, "after the deadline")
		if n := idem.CountRecords(s.MemoryStore, "c"); n != 0 {
			t.Errorf("%d records, want 0", n)
		}
		wantProcess(t, c, t.Context(), "redelivery", "m", noopHandler, idem.Processed, nil)
	})
}

// A handler that fails after its caller's context was cancelled: the
// rollback gets a context that has not ended, and a rollback that stalls
// ends at the store timeout with ErrStoreTimeout; the delivery is Failed
// and nothing is recorded.
func TestTxRollbackDetachedAndBounded(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := newSQLLikeStore()
		c := newTxConsumer(t, s, 2*time.Second)
		for _, stall := range []bool{false, true} {
			ctx, cancel := context.WithCancel(t.Context())
			h := func(ctx context.Context, _ *idem.MemoryTx, _ idem.Message) error {
				cancel()
				return ctx.Err()
			}
			if stall {
				s.setStall("rollback")
			}
			start := time.Now()
			err := wantProcess(t, c, ctx, "handler failing with its cancelled context", "m", h, idem.Failed, context.Canceled)
			took := time.Since(start)
			if r := s.lastRollback(t); r.err != nil || !r.ok || r.deadline.Sub(start) != 2*time.Second {
				t.Errorf("stall %v: Rollback's context: err %v, deadline %v (%v): want a live context ending at the store timeout (2s)", stall, r.err, r.deadline.Sub(start), r.ok)
			}
			if stall != errors.Is(err, idem.ErrStoreTimeout) || (stall && took != 2*time.Second) || (!stall && took != 0) {
				t.Errorf("stall %v: returned after %v with %v", stall, took, err)
			}
			s.setStall("")
			if n := idem.CountRecords(s.MemoryStore, "c"); n != 0 {
				t.Errorf("stall %v: %d records, want 0", stall, n)
			}
		}
		wantProcess(t, c, t.Context(), "redelivery", "m", noopHandler, idem.Processed, nil)
		s.everyTxEnded(t, "after the redelivery")
	})
}

// With a store timeout, a transaction allocates nothing for its deadlines
// under a context that cannot end or one that serves many transactions
// (a worker's): the contexts, the timer and the link to the caller's
// context are reused (before: 7 for a new message, 12 for a duplicate).
// Under a context of its own a new message pays the link
// (context.AfterFunc: 2) and what registering with a context for the first
// time makes in it (its Done channel and children map: 3); a duplicate
// still allocates less than without a store timeout, whose rollback gets a
// detached context of its own.
func TestTxDeadlineAllocations(t *testing.T) {
	if raceDetector {
		t.Skip("allocation counts under the race detector are not the program's")
	}
	longLived, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, tc := range []struct {
		name  string
		ctx   func() (context.Context, context.CancelFunc)
		extra float64
	}{
		{"background", func() (context.Context, context.CancelFunc) { return context.Background(), func() {} }, 0},
		{"long-lived", func() (context.Context, context.CancelFunc) { return longLived, func() {} }, 0},
		{"per message", func() (context.Context, context.CancelFunc) { return context.WithCancel(longLived) }, 5},
	} {
		allocs := func(storeTimeout time.Duration, dup bool) float64 {
			c := newTxConsumer(t, idem.NewMemoryStore(nil), storeTimeout)
			var i int
			msg := idem.Message{ID: "d", Payload: []byte("p")}
			process := func() {
				ctx, cancel := tc.ctx()
				defer cancel()
				if _, err := c.Process(ctx, msg, noopHandler); err != nil {
					t.Fatal(err)
				}
			}
			process()
			process()
			return testing.AllocsPerRun(200, func() {
				if !dup {
					i++
					msg.ID = fmt.Sprintf("m-%d", i)
				}
				process()
			})
		}
		for _, dup := range []bool{false, true} {
			unbounded, bounded := allocs(-1, dup), allocs(10*time.Second, dup)
			if bounded > unbounded+tc.extra {
				t.Errorf("%s, duplicate %v: %.0f allocations per message with a store timeout, %.0f without: want at most %v more", tc.name, dup, bounded, unbounded, tc.extra)
			}
			t.Logf("%s, duplicate %v: %.0f allocations per message with a store timeout, %.0f without", tc.name, dup, bounded, unbounded)
		}
	}
}

// countingCtx is a context that can end and counts the contexts linked to
// it: the context package registers a context derived from it through its
// AfterFunc method.
type countingCtx struct {
	mu   sync.Mutex
	done chan struct{}
	err  error
	made int            // links made
	live map[int]func() // links not stopped, by number
}

func newCountingCtx() *countingCtx {
	return &countingCtx{done: make(chan struct{}), live: map[int]func(){}}
}

func (c *countingCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c *countingCtx) Done() <-chan struct{}       { return c.done }
func (c *countingCtx) Value(any) any               { return nil }

func (c *countingCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *countingCtx) AfterFunc(f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	id := c.made
	c.made++
	c.live[id] = f
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		_, ok := c.live[id]
		delete(c.live, id)
		return ok
	}
}

func (c *countingCtx) cancel() {
	c.mu.Lock()
	c.err = context.Canceled
	fs := c.live
	c.live = map[int]func(){}
	close(c.done)
	c.mu.Unlock()
	for _, f := range fs {
		f()
	}
}

// links returns the links made so far and those not stopped.
func (c *countingCtx) links() (made, live int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.made, len(c.live)
}

// Transactions under one long-lived context share one link to it, which
// Close stops; a context given per message is unlinked when its
// transaction ends; a long-lived context that ends while no transaction
// runs fails the next delivery under it, and no other.
func TestTxCallerLinks(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := newSQLLikeStore()
		c, err := idem.NewConsumer[*idem.MemoryTx](s, idem.Config{Name: "c", PurgeInterval: -1, StoreTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		worker := newCountingCtx()
		for i := range 10 {
			wantProcess(t, c, worker, "under the worker's context", fmt.Sprintf("w-%d", i), noopHandler, idem.Processed, nil)
			wantProcess(t, c, worker, "duplicate under the worker's context", fmt.Sprintf("w-%d", i), noopHandler, idem.Duplicate, nil)
		}
		if made, live := worker.links(); made > 2 || live != 1 {
			t.Errorf("20 transactions under one context: %d links made, %d left, want at most 2 and 1", made, live)
		}
		for i := range 3 {
			msgCtx := newCountingCtx()
			wantProcess(t, c, msgCtx, "under a context of its own", fmt.Sprintf("p-%d", i), noopHandler, idem.Processed, nil)
			if made, live := msgCtx.links(); made != 1 || live != 0 {
				t.Errorf("transaction under a context of its own: %d links made, %d left, want 1 and 0", made, live)
			}
		}
		s.everyTxEnded(t, "after the transactions")
		worker.cancel()
		synctest.Wait()
		wantProcess(t, c, worker, "under the ended worker's context", "w-ended", noopHandler, idem.Failed, context.Canceled)
		wantProcess(t, c, t.Context(), "under another context", "w-ended", noopHandler, idem.Processed, nil)

		other := newCountingCtx()
		wantProcess(t, c, other, "under a second worker's context", "o-1", noopHandler, idem.Processed, nil)
		wantProcess(t, c, other, "under a second worker's context", "o-2", noopHandler, idem.Processed, nil)
		if _, live := other.links(); live != 1 {
			t.Errorf("two transactions under one context: %d links left, want 1", live)
		}
		c.Close()
		if _, live := other.links(); live != 0 {
			t.Errorf("after Close: %d links left, want 0", live)
		}
		s.everyTxEnded(t, "after Close")
	})
}

// ProcessTx's claim runs under the reused contexts too: a claim that
// stalls ends at the store timeout, or at once when the caller's context
// ends, and the caller's transaction is left to the caller; the next
// ProcessTx claims.
func TestTxProcessTxClaimBounded(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := newSQLLikeStore()
		c := newTxConsumer(t, s, 2*time.Second)
		msg := idem.Message{ID: "m", Payload: []byte("p")}
		s.setStall("claim")
		tx, err := s.Begin(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		out, err := c.ProcessTx(t.Context(), tx, msg, noopHandler)
		if out.Status != idem.Failed || !errors.Is(err, idem.ErrStoreTimeout) || time.Since(start) != 2*time.Second {
			t.Errorf("ProcessTx whose claim stalls: %v (%v) after %v, want Failed matching ErrStoreTimeout after 2s", out.Status, err, time.Since(start))
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() {
			_, err := c.ProcessTx(ctx, tx, msg, noopHandler)
			done <- err
		}()
		synctest.Wait()
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) || errors.Is(err, idem.ErrStoreTimeout) || time.Since(start) != 2*time.Second {
			t.Errorf("ProcessTx whose claim stalls, its context cancelled: %v, want an error matching context.Canceled at once", err)
		}
		if err := s.Rollback(t.Context(), tx); err != nil {
			t.Fatal(err)
		}
		s.setStall("")
		tx, err = s.Begin(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if out, err := c.ProcessTx(t.Context(), tx, msg, noopHandler); out.Status != idem.Processed || err != nil {
			t.Fatalf("ProcessTx: %v (%v), want Processed", out.Status, err)
		}
		if err := s.Commit(t.Context(), tx); err != nil {
			t.Fatal(err)
		}
		s.everyTxEnded(t, "after ProcessTx")
		if n := idem.CountRecords(s.MemoryStore, "c"); n != 1 {
			t.Errorf("%d records, want 1", n)
		}
	})
}

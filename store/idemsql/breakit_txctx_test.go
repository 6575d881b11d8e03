package idemsql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idemsql"
)

// TestBreakTxContextsCancelStorm: 4 workers process 150 messages through
// one Consumer on SQLite (database/sql rolls back a transaction whose
// context ends), under three kinds of caller contexts, taken in turn: the
// worker's long-lived one; one per message, cancelled as soon as Process
// returns (as a broker adapter does once it settled the message); one
// per message that another goroutine cancels a moment after Process
// starts, which may land in the handler or the commit; one that every
// worker shares, cancelled and replaced after every 10th call of this
// kind, in flight or not (a transaction's context kept linked to it
// meanwhile must not end another's). A message whose
// own context was cancelled may fail, and is processed again under a
// fresh one; no other call may fail, no handler of the first two kinds
// may start on an ended context, and every message ends with one record
// and one effect. (It logs the failures of cancelled calls whose error
// does not match context.Canceled.) It
// guards the contexts a Consumer keeps between transactions: one ended
// by another caller's cancellation (or left linked to it) would fail or
// roll back a transaction it does not belong to.
func TestBreakTxContextsCancelStorm(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idemsql.SQLite, envOptions{})
	c, err := idem.NewConsumer[*sql.Tx](e.store, idem.Config{Name: "storm", PurgeInterval: -1, StoreTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	const workers, messages = 4, 150
	long := t.Context()
	var (
		mu       sync.Mutex
		retried  int
		failures []string
		uncaused []string // errors of cancelled calls not matching context.Canceled
	)
	handler := func(ctx context.Context, tx *sql.Tx, m idem.Message) error {
		if k := ctx.Value(stormKey{}); ctx.Err() != nil && k != 2 && k != 3 {
			mu.Lock()
			failures = append(failures, fmt.Sprintf("%s: the handler started on an ended context (%v)", m.ID, context.Cause(ctx)))
			mu.Unlock()
		}
		return e.writeEffect(ctx, tx, m.ID)
	}
	// sharedCtx is the context every worker's calls of the fourth kind
	// share, cancelled and replaced after every 10th message: kept links
	// to it outlive their transactions.
	var (
		sharedMu     sync.Mutex
		shared       context.Context
		sharedCancel context.CancelFunc = func() {}
		sharedCount  int
	)
	sharedCtx := func(i int) context.Context {
		sharedMu.Lock()
		defer sharedMu.Unlock()
		if sharedCount++; shared == nil || sharedCount%10 == 0 {
			sharedCancel()
			shared, sharedCancel = context.WithCancel(long)
		}
		return shared
	}
	defer func() { sharedCancel() }()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < messages; i += workers {
				m := idem.Message{ID: fmt.Sprintf("m-%03d", i), Payload: []byte("p")}
				for try := 0; ; try++ {
					kind := (i + try) % 4
					ctx, cancel := long, context.CancelFunc(func() {})
					switch kind {
					case 1, 2:
						ctx, cancel = context.WithCancel(long)
					case 3:
						ctx = sharedCtx(i)
					}
					ctx = context.WithValue(ctx, stormKey{}, kind)
					stop := make(chan struct{})
					if kind == 2 {
						go func() {
							select {
							case <-time.After(time.Duration(i%7) * 100 * time.Microsecond):
							case <-stop:
							}
							cancel()
						}()
					}
					out, err := c.Process(ctx, m, handler)
					close(stop)
					cancelled := ctx.Err() != nil
					cancel()
					if out.Status == idem.Processed || out.Status == idem.Duplicate {
						break
					}
					mu.Lock()
					if !cancelled {
						failures = append(failures, fmt.Sprintf("%s: %v %v (its own context not cancelled)", m.ID, out.Status, err))
						mu.Unlock()
						return
					}
					retried++
					if !errors.Is(err, context.Canceled) {
						uncaused = append(uncaused, err.Error())
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	for _, f := range failures {
		t.Error(f)
	}
	for i := range messages {
		e.wantEffects(fmt.Sprintf("m-%03d", i), 1)
	}
	e.wantRecords("storm", messages)
	t.Logf("%d messages processed again after their own context was cancelled; %d of those failures did not match context.Canceled", retried, len(uncaused))
	for i, u := range uncaused {
		if i < 3 {
			t.Logf("  %s", u)
		}
	}
}

// stormKey marks the kind of a call's context in TestBreakTxContextsCancelStorm.
type stormKey struct{}

// TestBreakTxStoreTimeoutsReused: 4 workers process 120 messages on
// SQLite with a 40ms StoreTimeout while another connection takes the
// write lock (BEGIN IMMEDIATE) again and again for 0-80ms, so that some
// claims and commits run past the timeout. A call that fails with
// ErrStoreTimeout must have run for the timeout at least (a deadline
// left over from an earlier transaction, its timer reused, would cut a
// later call short); the message is processed again until it is done;
// each ends with one record and one effect.
func TestBreakTxStoreTimeoutsReused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idemsql.SQLite, envOptions{})
	const workers, messages, timeout = 4, 120, 40 * time.Millisecond
	c, err := idem.NewConsumer[*sql.Tx](e.store, idem.Config{Name: "timeouts", PurgeInterval: -1, StoreTimeout: timeout, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	ctx := t.Context()
	lockDone := make(chan struct{})
	stopLock := make(chan struct{})
	go func() {
		defer close(lockDone)
		conn, err := e.db.Conn(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		for i := 0; ; i++ {
			select {
			case <-stopLock:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
				continue
			}
			time.Sleep(time.Duration(i%5) * 20 * time.Millisecond)
			if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	var (
		mu             sync.Mutex
		timeouts, fast int
		other          []string
	)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < messages; i += workers {
				m := idem.Message{ID: fmt.Sprintf("m-%03d", i), Payload: []byte("p")}
				for try := 0; try < 200; try++ {
					start := time.Now()
					out, err := c.Process(ctx, m, e.effectHandler)
					took := time.Since(start)
					if out.Status == idem.Processed || out.Status == idem.Duplicate {
						break
					}
					mu.Lock()
					switch {
					case errors.Is(err, idem.ErrStoreTimeout):
						timeouts++
						if took < timeout {
							fast++
							other = append(other, fmt.Sprintf("%s: ErrStoreTimeout after %v, under the %v timeout", m.ID, took, timeout))
						}
					default:
						other = append(other, fmt.Sprintf("%s: %v %v after %v", m.ID, out.Status, err, took))
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	close(stopLock)
	<-lockDone
	for i, o := range other {
		if i < 10 {
			t.Log(o)
		}
	}
	if fast > 0 {
		t.Errorf("%d of %d store timeouts came before the timeout", fast, timeouts)
	}
	for i := range messages {
		e.wantEffects(fmt.Sprintf("m-%03d", i), 1)
	}
	e.wantRecords("timeouts", messages)
	t.Logf("%d calls failed with ErrStoreTimeout, %d otherwise", timeouts, len(other)-fast)
}

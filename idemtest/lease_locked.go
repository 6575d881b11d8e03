package idemtest

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

// The Locked cases hold one record locked from another session
// (LeaseSetup.LockRecord; skipped without it) while leases beside it are
// renewed: by a RenewBatch called directly, and by a LeaseConsumer
// holding 40 attempts. A lock on one record costs at most that record's
// renewal.
func leaseLockedCases() []leaseCase {
	return []leaseCase{
		{"RenewBatchSkipsIt", testRenewBatchOneLocked},
		{"RenewalsBesideIt", testRenewalsBesideLocked},
	}
}

// needLock skips the test when the Setup cannot lock a record.
func (b *leaseBundle) needLock() {
	b.t.Helper()
	if b.s.LockRecord == nil {
		b.t.Skip("the Setup cannot lock a record from another session (LeaseSetup.LockRecord)")
	}
}

// lock locks consumer's record id through LeaseSetup.LockRecord, or
// skips the test without it; the lock ends with the test unless the
// returned function ended it first.
func (b *leaseBundle) lock(consumer, id string) (unlock func()) {
	b.t.Helper()
	b.needLock()
	end, err := b.s.LockRecord(b.ctx, consumer, id)
	if err != nil {
		b.t.Fatalf("LockRecord(%q, %q): %v", consumer, id, err)
	}
	var once sync.Once
	unlock = func() {
		once.Do(func() {
			if err := end(); err != nil {
				b.t.Errorf("ending the lock of %q: %v", id, err)
			}
		})
	}
	b.t.Cleanup(unlock)
	return unlock
}

// A renewal batch does not wait for a record another session holds
// locked (an operator's open transaction, a Complete in flight): it
// renews the others at once and leaves that one unjudged
// (idemdriver.ErrRenewNotJudged, not ErrLeaseLost), and a later batch
// renews it once the lock is gone. The batch's context ends 5s after it
// starts, long before a server's lock wait timeout: a batch that waited
// for the lock would fail as a whole. Skipped for a store that does not
// renew in batches.
func testRenewBatchOneLocked(t *testing.T, b *leaseBundle) {
	r := b.batchRenewer()
	b.needLock()
	consumer := b.name("c")
	m := func(id string) idem.Message { return idem.Message{ID: id, Payload: []byte("p")} }
	ids := []string{"a", "b", "c"}
	ps := make([]idemdriver.RenewParams, len(ids))
	for i, id := range ids {
		res := b.mustAcquire(id, consumer, m(id), time.Minute, 1)
		ps[i] = idemdriver.RenewParams{Consumer: consumer, MessageID: id, Token: res.Token, Lease: longLease}
	}
	unlock := b.lock(consumer, "b")
	bctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	errs, err := r.RenewBatch(bctx, ps)
	cancel()
	if err != nil {
		t.Fatalf("RenewBatch with b locked: the batch failed as a whole (%v); want a and c renewed, b not judged", err)
	}
	if len(errs) != len(ps) || errs[0] != nil || errs[2] != nil || !errors.Is(errs[1], idemdriver.ErrRenewNotJudged) || errors.Is(errs[1], idem.ErrLeaseLost) {
		t.Fatalf("RenewBatch with b locked: %v; want a and c renewed, b not judged (ErrRenewNotJudged, not ErrLeaseLost)", errs)
	}
	left := func(id string) time.Duration {
		t.Helper()
		res := b.acquire(id+" while held", consumer, m(id), time.Minute)
		b.wantNotAcquired(id+" while held", res, idemdriver.StateInProgress)
		return res.LeaseRemaining
	}
	if l := left("a"); l <= time.Minute {
		t.Errorf("a: %v of lease left after the batch, want more than a minute (renewed for %v)", l, longLease)
	}
	unlock()
	if l := left("b"); l > time.Minute {
		t.Errorf("b: %v of lease left, want at most its first minute (not renewed while locked)", l)
	}
	errs, err = r.RenewBatch(b.ctx, ps)
	if err != nil || len(errs) != len(ps) || errs[0] != nil || errs[1] != nil || errs[2] != nil {
		t.Fatalf("RenewBatch once the lock is gone: %v %v; want every lease renewed", errs, err)
	}
	if l := left("b"); l <= time.Minute {
		t.Errorf("b: %v of lease left after the second batch, want more than a minute", l)
	}
}

// renewCounter counts the renewals of each message from start on
// (HookLeaseRenewed), and closes done once every message but skip has
// been renewed need times.
type renewCounter struct {
	mu      sync.Mutex
	counts  map[string]int
	skip    string
	need    int
	pending int // messages still short of need
	done    chan struct{}
}

func (r *renewCounter) start(ids []string, skip string, need int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.counts, r.skip, r.need, r.pending, r.done = map[string]int{}, skip, need, len(ids)-1, make(chan struct{})
}

func (r *renewCounter) OnLeaseRenewed(_ context.Context, e idem.LeaseEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.counts == nil || e.MessageID == r.skip {
		return
	}
	r.counts[e.MessageID]++
	if r.counts[e.MessageID] == r.need {
		if r.pending--; r.pending == 0 {
			close(r.done)
		}
	}
}

// A LeaseConsumer holds 40 attempts at a 1.5s lease (renewed every 0.5s)
// while another session holds the first one's record locked, until each
// of the other 39 has been renewed four times since the lock was taken
// (more than a lease: without those renewals their leases would have run
// out). The others keep landing: none of their contexts ends, and each
// Complete succeeds. A renewal batch that waited on the one locked row
// would cost every lease in it.
//
// The consumer runs in a testing/synctest bubble (bubbleStore): its
// clock, which runs the renewal ticks and the local deadlines, stands
// still while a store call is in flight, so a machine too loaded to
// answer within the lease cannot end a lease here; the store's own
// clock, which runs on, judges a renewal by its token, not by time. The
// store calls go to the Setup's store from outside the bubble, the
// renewal batches with the record really locked. The locked record's
// renewal alone, which the store makes wait for the lock, waits in the
// bubble instead until the lock ends, then goes to the store: a call
// held outside the bubble would stop its clock. A batch that waited for
// the lock fails at batchGuard (real time), and the leases with it.
func testRenewalsBesideLocked(t *testing.T, b *leaseBundle) {
	b.needLock()
	const n, lease = 40, 1500 * time.Millisecond
	name := b.name("c")
	w := newBubbleStore(t, b)
	lock := &heldLock{}
	t.Cleanup(func() { _ = lock.end() })
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("m-%02d", i)
	}
	synctest.Test(t, func(t *testing.T) {
		counter := &renewCounter{}
		c, err := idem.NewLeaseConsumer(w, idem.Config{Name: name, Lease: lease, PurgeInterval: -1, Hooks: []idem.Hook{counter}})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = c.Close() }()
		attempts := make([]*idem.Attempt, n)
		for i := range attempts {
			a, out, err := c.Acquire(context.Background(), idem.Message{ID: ids[i], Payload: []byte("p")}, idem.AcquireOptions{})
			if a == nil {
				t.Fatalf("Acquire %s: %v %v", ids[i], out, err)
			}
			attempts[i] = a
		}
		var lockErr error
		w.out.do(func() { lockErr = lock.take(b.ctx, b.s.LockRecord, name, ids[0]) })
		if lockErr != nil {
			t.Fatalf("LockRecord(%q, %q): %v", name, ids[0], lockErr)
		}
		w.hold(ids[0])
		counter.start(ids, ids[0], 4)
		select {
		case <-counter.done:
		case <-time.After(20 * lease):
			t.Errorf("the attempts beside the locked record were not renewed 4 times each in %v", 20*lease)
		}
		for _, a := range attempts[1:] {
			if err := a.Context().Err(); err != nil {
				t.Errorf("%s: context ended (%v) while another record was locked", a.Message.ID, context.Cause(a.Context()))
			}
		}
		w.out.do(func() { lockErr = lock.end() })
		if lockErr != nil {
			t.Errorf("ending the lock of %q: %v", ids[0], lockErr)
		}
		w.release()
		for _, a := range attempts[1:] {
			if out, err := a.Complete(context.Background(), idem.Result{}); err != nil || out.Status != idem.Processed {
				t.Errorf("%s: Complete = %v, %v; want processed", a.Message.ID, out.Status, err)
			}
		}
		t.Logf("the locked record's attempt: context cause %v", context.Cause(attempts[0].Context()))
		_, _ = attempts[0].Complete(context.Background(), idem.Result{})
	})
	if got := w.batchFailures.Load(); got > 0 {
		t.Errorf("%d renewal batches failed with one record locked (a batch waited for the lock?)", got)
	}
}

// heldLock is a record lock taken through LeaseSetup.LockRecord, ended
// once.
type heldLock struct {
	mu     sync.Mutex
	unlock func() error
}

func (l *heldLock) take(ctx context.Context, lock func(context.Context, string, string) (func() error, error), consumer, id string) (err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.unlock, err = lock(ctx, consumer, id)
	return err
}

// end ends the lock if it is held.
func (l *heldLock) end() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	unlock := l.unlock
	l.unlock = nil
	if unlock == nil {
		return nil
	}
	return unlock()
}

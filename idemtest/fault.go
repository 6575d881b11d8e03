package idemtest

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// errInjected is the error the fault decorator injects.
var errInjected = errors.New("idemtest: injected store fault")

// fault names one injectable failure.
type fault int

const (
	// faultBegin fails Begin (or BeginClaim) before it reaches the store.
	faultBegin fault = iota
	// faultClaim fails ClaimTx (or BeginClaim) after the store made the
	// claim in the transaction, so the Consumer must roll it back.
	faultClaim
	// faultClaimBatch fails ClaimBatchTx after the store made the claims.
	faultClaimBatch
	// faultCommit fails Commit before it reaches the store: nothing commits.
	faultCommit
	// faultCommitLost reports a failure after the store committed, like a
	// connection lost while the COMMIT's reply was on its way.
	faultCommitLost
	numFaults
)

// faultStore decorates a TxStore and fails the next call of an armed kind
// once. Its method set is TxStore's only: the inner
// store's BeginClaim is hidden, so the Consumer takes the Begin-then-ClaimTx
// path. faultBeginClaimStore adds a decorated BeginClaim, and
// faultBeginBatchClaimStore a decorated BeginClaimBatch.
type faultStore[TTx any] struct {
	inner idemdriver.TxStore[TTx]
	armed [numFaults]atomic.Bool
	fired [numFaults]atomic.Int32
	// stall makes an armed fault a stalled connection instead of an
	// error: the call blocks until its context ends and returns the
	// context's error.
	stall atomic.Bool
}

// arm makes the next call of kind f fail.
func (f *faultStore[TTx]) arm(k fault) { f.armed[k].Store(true) }

// armStall makes the next call of kind f stall until its context ends.
func (f *faultStore[TTx]) armStall(k fault) {
	f.stall.Store(true)
	f.armed[k].Store(true)
}

// injected returns the injected error of a fault that fired: errInjected,
// or, for a stall, ctx's error once ctx has ended.
func (f *faultStore[TTx]) injected(ctx context.Context) error {
	if !f.stall.Load() {
		return errInjected
	}
	<-ctx.Done()
	return ctx.Err()
}

// fire reports whether a call of kind k must fail now, disarming it.
func (f *faultStore[TTx]) fire(k fault) bool {
	if f.armed[k].CompareAndSwap(true, false) {
		f.fired[k].Add(1)
		return true
	}
	return false
}

func (f *faultStore[TTx]) Begin(ctx context.Context) (TTx, error) {
	if f.fire(faultBegin) {
		var zero TTx
		return zero, f.injected(ctx)
	}
	return f.inner.Begin(ctx)
}

func (f *faultStore[TTx]) ClaimTx(ctx context.Context, tx TTx, p *idemdriver.ClaimParams) (idemdriver.ClaimResult, error) {
	res, err := f.inner.ClaimTx(ctx, tx, p)
	if err == nil && f.fire(faultClaim) {
		return idemdriver.ClaimResult{}, f.injected(ctx)
	}
	return res, err
}

func (f *faultStore[TTx]) ClaimBatchTx(ctx context.Context, tx TTx, p *idemdriver.ClaimBatchParams) ([]idemdriver.ClaimResult, error) {
	res, err := idemdriver.ClaimBatch(ctx, f.inner, tx, p)
	if err == nil && f.fire(faultClaimBatch) {
		return nil, errInjected
	}
	return res, err
}

func (f *faultStore[TTx]) Commit(ctx context.Context, tx TTx) error {
	if f.fire(faultCommit) {
		return f.injected(ctx)
	}
	err := f.inner.Commit(ctx, tx)
	if err == nil && f.fire(faultCommitLost) {
		return errInjected
	}
	return err
}

func (f *faultStore[TTx]) Rollback(ctx context.Context, tx TTx) error {
	return f.inner.Rollback(ctx, tx)
}

func (f *faultStore[TTx]) MarkRunning(ctx context.Context, p *idemdriver.MarkRunningParams) error {
	return f.inner.MarkRunning(ctx, p)
}

func (f *faultStore[TTx]) BeginPurge(ctx context.Context, p *idemdriver.BeginPurgeParams) (idemdriver.PurgeSession, error) {
	return f.inner.BeginPurge(ctx, p)
}

// faultBeginClaimStore is a faultStore over a store with BeginClaim, which
// it keeps, decorated.
type faultBeginClaimStore[TTx any] struct {
	*faultStore[TTx]
	bc idemdriver.BeginClaimer[TTx]
}

func (f *faultBeginClaimStore[TTx]) BeginClaim(ctx context.Context, p *idemdriver.ClaimParams) (TTx, idemdriver.ClaimResult, error) {
	var zero TTx
	if f.fire(faultBegin) {
		return zero, idemdriver.ClaimResult{}, f.injected(ctx)
	}
	tx, res, err := f.bc.BeginClaim(ctx, p)
	if err == nil && f.fire(faultClaim) {
		err := f.injected(ctx)
		// BeginClaim's contract: on error no transaction is left open.
		if !res.Ended {
			_ = f.inner.Rollback(context.WithoutCancel(ctx), tx)
		}
		return zero, idemdriver.ClaimResult{}, err
	}
	return tx, res, err
}

// faultBeginBatchClaimStore is a faultStore over a store with
// BeginClaimBatch, which it keeps, decorated: faultBegin fails it before
// it reaches the store, faultClaimBatch after the store made the claims.
type faultBeginBatchClaimStore[TTx any] struct {
	*faultStore[TTx]
	bbc idemdriver.BeginBatchClaimer[TTx]
}

func (f *faultBeginBatchClaimStore[TTx]) BeginClaimBatch(ctx context.Context, p *idemdriver.ClaimBatchParams) (TTx, []idemdriver.ClaimResult, error) {
	var zero TTx
	if f.fire(faultBegin) {
		return zero, nil, f.injected(ctx)
	}
	tx, res, err := f.bbc.BeginClaimBatch(ctx, p)
	if err == nil && f.fire(faultClaimBatch) {
		// BeginClaimBatch's contract: on error no transaction is left open.
		_ = f.inner.Rollback(context.WithoutCancel(ctx), tx)
		return zero, nil, errInjected
	}
	return tx, res, err
}

// batchPaths returns the ways the Consumer claims a batch on store: Begin
// then ClaimBatchTx always, and BeginClaimBatch when the store has it.
func batchPaths[TTx any](store idemdriver.TxStore[TTx]) []claimPath[TTx] {
	paths := []claimPath[TTx]{{"BeginThenClaimBatchTx", func(s idemdriver.TxStore[TTx]) (idemdriver.TxStore[TTx], *faultStore[TTx]) {
		f := &faultStore[TTx]{inner: s}
		return f, f
	}}}
	if _, ok := store.(idemdriver.BeginBatchClaimer[TTx]); ok {
		paths = append(paths, claimPath[TTx]{"BeginClaimBatch", func(s idemdriver.TxStore[TTx]) (idemdriver.TxStore[TTx], *faultStore[TTx]) {
			f := &faultStore[TTx]{inner: s}
			return &faultBeginBatchClaimStore[TTx]{faultStore: f, bbc: s.(idemdriver.BeginBatchClaimer[TTx])}, f
		}})
	}
	return paths
}

// claimPath is one way the Consumer claims a single message.
type claimPath[TTx any] struct {
	name string
	wrap func(idemdriver.TxStore[TTx]) (idemdriver.TxStore[TTx], *faultStore[TTx])
}

// claimPaths returns the claim paths of store: Begin then ClaimTx always,
// and BeginClaim when the store has it.
func claimPaths[TTx any](store idemdriver.TxStore[TTx]) []claimPath[TTx] {
	paths := []claimPath[TTx]{{"BeginThenClaimTx", func(s idemdriver.TxStore[TTx]) (idemdriver.TxStore[TTx], *faultStore[TTx]) {
		f := &faultStore[TTx]{inner: s}
		return f, f
	}}}
	if _, ok := store.(idemdriver.BeginClaimer[TTx]); ok {
		paths = append(paths, claimPath[TTx]{"BeginClaim", func(s idemdriver.TxStore[TTx]) (idemdriver.TxStore[TTx], *faultStore[TTx]) {
			f := &faultStore[TTx]{inner: s}
			return &faultBeginClaimStore[TTx]{faultStore: f, bc: s.(idemdriver.BeginClaimer[TTx])}, f
		}})
	}
	return paths
}

func faultCases[TTx any]() []testCase[TTx] {
	return []testCase[TTx]{
		{"BeginFails", forEachClaimPath(testFaultBegin[TTx])},
		{"ClaimFails", forEachClaimPath(testFaultClaim[TTx])},
		{"CommitFails", forEachClaimPath(testFaultCommit[TTx])},
		{"CommitLostAfterSuccess", forEachClaimPath(testFaultCommitLost[TTx])},
		{"ProcessTxClaimFails", testFaultProcessTxClaim[TTx]},
		{"BatchClaimFails", forEachPath(batchPaths[TTx], testFaultBatchClaim[TTx])},
		{"BatchCommitFails", forEachPath(batchPaths[TTx], testFaultBatchCommit[TTx])},
	}
}

// forEachClaimPath runs fn once per claim path of the store, each in a
// parallel subtest with its own Setup.
func forEachClaimPath[TTx any](fn func(t *testing.T, b *bundle[TTx], store idemdriver.TxStore[TTx], f *faultStore[TTx])) func(*testing.T, *bundle[TTx]) {
	return forEachPath(claimPaths[TTx], fn)
}

// forEachPath runs fn once per path that paths returns for the store,
// each in a parallel subtest with its own Setup.
func forEachPath[TTx any](paths func(idemdriver.TxStore[TTx]) []claimPath[TTx], fn func(t *testing.T, b *bundle[TTx], store idemdriver.TxStore[TTx], f *faultStore[TTx])) func(*testing.T, *bundle[TTx]) {
	return func(t *testing.T, b *bundle[TTx]) {
		for _, p := range paths(b.s.Store) {
			t.Run(p.name, func(t *testing.T) {
				t.Parallel()
				nb := b.fresh(t, p.name)
				store, f := p.wrap(nb.s.Store)
				fn(t, nb, store, f)
			})
		}
	}
}

// wantInjected checks a delivery that failed on the injected fault: Failed,
// matching ErrStore and the injected error.
func (b *bundle[TTx]) wantInjected(what, id string, out idem.Outcome, err error) {
	b.t.Helper()
	b.wantOutcome(what, id, out, err, idem.Failed, idem.ErrStore)
	if !errors.Is(err, errInjected) {
		b.t.Errorf("%s: err = %v, want the store's own error (%v) reachable with errors.Is", what, err, errInjected)
	}
	if idem.IsPermanent(err) {
		b.t.Errorf("%s: IsPermanent(%v) = true, want false (a store fault is retryable)", what, err)
	}
}

// Begin fails: the handler is not called, nothing is recorded, and the
// redelivery, on the same Consumer, is processed.
func testFaultBegin[TTx any](t *testing.T, b *bundle[TTx], store idemdriver.TxStore[TTx], f *faultStore[TTx]) {
	c := b.consumerOn(store, "c", idem.Config{})
	var calls atomic.Int64
	h := b.handler(c, &calls)
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}
	f.arm(faultBegin)
	out, err := c.Process(b.ctx, msg, h)
	b.wantInjected("delivery whose begin fails", msg.ID, out, err)
	b.wantCalls("after the failed begin", &calls, 0)
	b.wantRecords("after the failed begin", c.Name(), 0)
	b.process("redelivery", c, msg, h, idem.Processed, nil)
	b.wantEffects("after the redelivery", c.Name(), msg.ID, 1)
}

// the claim fails (after the store made it in the
// transaction). The Consumer rolls back, remembers nothing, and the
// redelivery on the same Consumer is processed.
func testFaultClaim[TTx any](t *testing.T, b *bundle[TTx], store idemdriver.TxStore[TTx], f *faultStore[TTx]) {
	c := b.consumerOn(store, "c", idem.Config{})
	var calls atomic.Int64
	h := b.handler(c, &calls)
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}
	f.arm(faultClaim)
	out, err := c.Process(b.ctx, msg, h)
	b.wantInjected("delivery whose claim fails", msg.ID, out, err)
	if f.fired[faultClaim].Load() != 1 {
		t.Fatalf("the injected claim fault did not fire; the Consumer claimed some other way")
	}
	b.wantCalls("after the failed claim", &calls, 0)
	b.wantRecords("after the failed claim", c.Name(), 0)
	b.process("redelivery after the failed claim", c, msg, h, idem.Processed, nil)
	b.process("redelivery after success", c, msg, h, idem.Duplicate, nil)
	b.wantCalls("after the redeliveries", &calls, 1)
	b.wantEffects("after the redeliveries", c.Name(), msg.ID, 1)
	b.wantRecords("after the redeliveries", c.Name(), 1)
}

// Commit fails: the handler ran but its effects and the claim are rolled
// back; the redelivery runs it again and commits once.
func testFaultCommit[TTx any](t *testing.T, b *bundle[TTx], store idemdriver.TxStore[TTx], f *faultStore[TTx]) {
	c := b.consumerOn(store, "c", idem.Config{})
	var calls atomic.Int64
	h := b.handler(c, &calls)
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}
	f.arm(faultCommit)
	out, err := c.Process(b.ctx, msg, h)
	b.wantInjected("delivery whose commit fails", msg.ID, out, err)
	b.wantCalls("after the failed commit", &calls, 1)
	b.wantEffects("after the failed commit", c.Name(), msg.ID, 0)
	b.wantRecords("after the failed commit", c.Name(), 0)
	b.process("redelivery after the failed commit", c, msg, h, idem.Processed, nil)
	b.wantCalls("after the redelivery", &calls, 2)
	b.wantEffects("after the redelivery", c.Name(), msg.ID, 1)
	b.wantRecords("after the redelivery", c.Name(), 1)
}

// The commit succeeded but its reply was lost: the delivery is Failed (the
// outcome is unknown to the Consumer), and the redelivery finds the record
// and is a Duplicate: the effect happened exactly once.
func testFaultCommitLost[TTx any](t *testing.T, b *bundle[TTx], store idemdriver.TxStore[TTx], f *faultStore[TTx]) {
	c := b.consumerOn(store, "c", idem.Config{})
	var calls atomic.Int64
	h := b.handler(c, &calls)
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}
	f.arm(faultCommitLost)
	out, err := c.Process(b.ctx, msg, h)
	b.wantInjected("delivery whose commit reply is lost", msg.ID, out, err)
	b.wantEffects("after the lost commit reply", c.Name(), msg.ID, 1)
	b.wantRecords("after the lost commit reply", c.Name(), 1)
	b.process("redelivery after the lost commit reply", c, msg, h, idem.Duplicate, nil)
	b.wantCalls("after the redelivery", &calls, 1)
	b.wantEffects("after the redelivery", c.Name(), msg.ID, 1)
}

// The claim fails inside the caller's transaction: ProcessTx reports it,
// the caller rolls back, and a later ProcessTx processes the message.
func testFaultProcessTxClaim[TTx any](t *testing.T, b *bundle[TTx]) {
	f := &faultStore[TTx]{inner: b.s.Store}
	c := b.consumerOn(f, "c", idem.Config{})
	var calls atomic.Int64
	h := b.handler(c, &calls)
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}
	f.arm(faultClaim)
	tx := b.begin()
	out, err := c.ProcessTx(b.ctx, tx, msg, h)
	b.wantInjected("ProcessTx whose claim fails", msg.ID, out, err)
	b.rollback(tx)
	b.wantCalls("after the failed claim", &calls, 0)
	b.wantRecords("after the failed claim", c.Name(), 0)

	tx = b.begin()
	out, err = c.ProcessTx(b.ctx, tx, msg, h)
	b.wantOutcome("ProcessTx retry", msg.ID, out, err, idem.Processed, nil)
	b.commit(tx)
	b.wantEffects("after the retry", c.Name(), msg.ID, 1)
	b.wantRecords("after the retry", c.Name(), 1)
}

// The batch claim fails: every valid message is Failed (whether it was new
// cannot be known), invalid ones are still Rejected, nothing is recorded,
// and the retried batch is processed.
func testFaultBatchClaim[TTx any](t *testing.T, b *bundle[TTx], store idemdriver.TxStore[TTx], f *faultStore[TTx]) {
	c := b.consumerOn(store, "c", idem.Config{})
	var bc batchCalls
	h := b.batchHandler(c, &bc)
	old := idem.Message{ID: "old", Payload: []byte("p")}
	if _, err := c.ProcessBatch(b.ctx, []idem.Message{old}, h); err != nil {
		t.Fatalf("first batch: %v", err)
	}
	batch := []idem.Message{{ID: "n-1", Payload: []byte("p")}, old, {ID: ""}, {ID: "n-2", Payload: []byte("p")}}
	f.arm(faultClaimBatch)
	outs, err := c.ProcessBatch(b.ctx, batch, h)
	if !errors.Is(err, idem.ErrStore) || !errors.Is(err, errInjected) {
		t.Errorf("batch whose claim fails: err = %v, want it to match ErrStore and the injected error", err)
	}
	b.checkBatch("batch whose claim fails", batch, outs, []wantOut{
		{idem.Failed, idem.ErrStore}, {idem.Failed, idem.ErrStore}, {idem.Rejected, idem.ErrMissingMessageID}, {idem.Failed, idem.ErrStore},
	})
	wantHandlerCalls(t, "batch whose claim fails", &bc, []string{"old"})
	b.wantRecords("after the failed batch claim", c.Name(), 1)

	outs, _ = c.ProcessBatch(b.ctx, batch, h)
	b.checkBatch("retried batch", batch, outs, []wantOut{
		{idem.Processed, nil}, {idem.Duplicate, nil}, {idem.Rejected, idem.ErrMissingMessageID}, {idem.Processed, nil},
	})
	b.wantRecords("after the retried batch", c.Name(), 3)
	b.wantEffects("after the retried batch", c.Name(), "n-1", 1)
	b.wantEffects("after the retried batch", c.Name(), "n-2", 1)
}

// The batch commit fails: the new messages are Failed and rolled back with
// the handler's effects; the duplicate keeps its Duplicate outcome; the
// retry is processed.
func testFaultBatchCommit[TTx any](t *testing.T, b *bundle[TTx], store idemdriver.TxStore[TTx], f *faultStore[TTx]) {
	c := b.consumerOn(store, "c", idem.Config{})
	var bc batchCalls
	h := b.batchHandler(c, &bc)
	old := idem.Message{ID: "old", Payload: []byte("p")}
	if _, err := c.ProcessBatch(b.ctx, []idem.Message{old}, h); err != nil {
		t.Fatalf("first batch: %v", err)
	}
	batch := []idem.Message{{ID: "n-1", Payload: []byte("p")}, old, {ID: "n-2", Payload: []byte("p")}}
	f.arm(faultCommit)
	outs, _ := c.ProcessBatch(b.ctx, batch, h)
	b.checkBatch("batch whose commit fails", batch, outs, []wantOut{
		{idem.Failed, idem.ErrStore}, {idem.Duplicate, nil}, {idem.Failed, idem.ErrStore},
	})
	b.wantRecords("after the failed batch commit", c.Name(), 1)
	b.wantEffects("after the failed batch commit", c.Name(), "n-1", 0)

	outs, _ = c.ProcessBatch(b.ctx, batch, h)
	b.checkBatch("retried batch", batch, outs, []wantOut{{idem.Processed, nil}, {idem.Duplicate, nil}, {idem.Processed, nil}})
	wantHandlerCalls(t, "failed then retried batch", &bc, []string{"old"}, []string{"n-1", "n-2"}, []string{"n-1", "n-2"})
	b.wantRecords("after the retried batch", c.Name(), 3)
	b.wantEffects("after the retried batch", c.Name(), "n-1", 1)
}

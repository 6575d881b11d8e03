package idemtest

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// faultEmitStore is a faultStore that can also emit: EmitTx goes to the
// inner store, and the commit that follows it through the decorated
// Commit. Without EmitCommit, the Consumer emits and commits in two steps.
type faultEmitStore[TTx any] struct {
	*faultStore[TTx]
	emit idemdriver.OutboxTx[TTx]
}

func (f *faultEmitStore[TTx]) EmitTx(ctx context.Context, tx TTx, p *idemdriver.EmitParams) error {
	return f.emit.EmitTx(ctx, tx, p)
}

// faultEmitCommitStore is a faultEmitStore over a store with EmitCommit,
// which it keeps, decorated as Commit is: faultCommit fails it before it
// reaches the store, faultCommitLost after the store committed.
type faultEmitCommitStore[TTx any] struct {
	*faultEmitStore[TTx]
	ec idemdriver.OutboxCommitter[TTx]
}

func (f *faultEmitCommitStore[TTx]) EmitCommit(ctx context.Context, tx TTx, p *idemdriver.EmitParams) error {
	if f.fire(faultCommit) {
		return f.injected(ctx)
	}
	err := f.ec.EmitCommit(ctx, tx, p)
	if err == nil && f.fire(faultCommitLost) {
		return errInjected
	}
	return err
}

// emitPaths returns the ways the Consumer writes a handler's outgoing
// messages and commits on store: EmitTx then Commit always, and
// EmitCommit when the store has it.
func emitPaths[TTx any](store idemdriver.TxStore[TTx]) []claimPath[TTx] {
	paths := []claimPath[TTx]{{"EmitTxThenCommit", func(s idemdriver.TxStore[TTx]) (idemdriver.TxStore[TTx], *faultStore[TTx]) {
		f := &faultStore[TTx]{inner: s}
		return &faultEmitStore[TTx]{faultStore: f, emit: s.(idemdriver.OutboxTx[TTx])}, f
	}}}
	if _, ok := store.(idemdriver.OutboxCommitter[TTx]); ok {
		paths = append(paths, claimPath[TTx]{"EmitCommit", func(s idemdriver.TxStore[TTx]) (idemdriver.TxStore[TTx], *faultStore[TTx]) {
			f := &faultStore[TTx]{inner: s}
			return &faultEmitCommitStore[TTx]{faultEmitStore: &faultEmitStore[TTx]{faultStore: f, emit: s.(idemdriver.OutboxTx[TTx])},
				ec: s.(idemdriver.OutboxCommitter[TTx])}, f
		}})
	}
	return paths
}

// emitFaultCases are the outbox suite's store-fault cases, each on every
// emit path of the store.
func emitFaultCases[TTx any]() []testCase[TTx] {
	return []testCase[TTx]{
		{"EmittingCommitFails", forEachPath(emitPaths[TTx], testFaultEmitCommit[TTx])},
		{"EmittingCommitLostAfterSuccess", forEachPath(emitPaths[TTx], testFaultEmitCommitLost[TTx])},
	}
}

// sendAll relays everything pending to a new recorder and returns the IDs
// it sent, sorted.
func (b *bundle[TTx]) sendAll(what string) []string {
	b.t.Helper()
	rec := newRecorder()
	b.drain(what, b.relay(b.outboxOf(), rec, idem.RelayConfig{}), nil)
	got := rec.sentIDs()
	slices.Sort(got)
	return got
}

// processFaulty processes msg with fault k armed on f, and checks that
// the fault fired and the delivery failed on it.
func (b *bundle[TTx]) processFaulty(what string, c *idem.Consumer[TTx], f *faultStore[TTx], k fault, msg idem.Message, h idem.Handler[TTx]) {
	b.t.Helper()
	f.arm(k)
	out, err := c.Process(b.ctx, msg, h)
	if f.fired[k].Load() != 1 {
		b.t.Fatalf("%s: the injected fault did not fire; the Consumer took some other path", what)
	}
	b.wantInjected(what, msg.ID, out, err)
}

// The commit of a transaction that emitted fails: no outgoing row is
// left, and the redelivery, which runs the handler again, emits the same
// IDs once.
func testFaultEmitCommit[TTx any](t *testing.T, b *bundle[TTx], store idemdriver.TxStore[TTx], f *faultStore[TTx]) {
	c := b.consumerOn(store, "c", idem.Config{})
	var calls atomic.Int64
	h := b.emitting(c, &calls, func(m idem.Message) []idem.OutgoingMessage {
		return []idem.OutgoingMessage{{Name: "a", Destination: "d", Key: "k", Payload: []byte(m.ID)}, {Name: "b", Destination: "e", Payload: []byte(m.ID)}}
	})
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}
	b.processFaulty("delivery whose emitting commit fails", c, f, faultCommit, msg, h)
	b.wantPending("after the failed commit", 0)
	b.wantEffects("after the failed commit", c.Name(), msg.ID, 0)
	b.wantRecords("after the failed commit", c.Name(), 0)
	b.process("redelivery", c, msg, h, idem.Processed, nil)
	b.wantCalls("after the redelivery", &calls, 2)
	b.wantPending("after the redelivery", 2)
	want := []string{idem.OutgoingID(c.Name(), msg.ID, "a", 1), idem.OutgoingID(c.Name(), msg.ID, "b", 2)}
	slices.Sort(want)
	if got := b.sendAll("send"); !slices.Equal(got, want) {
		t.Errorf("sent %q, want %q once each", got, want)
	}
}

// The commit of a transaction that emitted succeeded but its reply was
// lost: the delivery is Failed, its rows are committed, and the
// redelivery is a Duplicate that emits nothing: each row is sent once.
func testFaultEmitCommitLost[TTx any](t *testing.T, b *bundle[TTx], store idemdriver.TxStore[TTx], f *faultStore[TTx]) {
	c := b.consumerOn(store, "c", idem.Config{})
	var calls atomic.Int64
	h := b.emitting(c, &calls, one("d", "k"))
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}
	b.processFaulty("delivery whose emitting commit's reply is lost", c, f, faultCommitLost, msg, h)
	b.wantPending("after the lost reply", 1)
	b.wantRecords("after the lost reply", c.Name(), 1)
	b.process("redelivery", c, msg, h, idem.Duplicate, nil)
	b.wantCalls("after the redelivery", &calls, 1)
	b.wantPending("after the redelivery", 1)
	if got, want := b.sendAll("send"), []string{idem.OutgoingID(c.Name(), msg.ID, "", 1)}; !slices.Equal(got, want) {
		t.Errorf("sent %q, want %q once", got, want)
	}
}

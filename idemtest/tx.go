package idemtest

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
)

// The Tx cases never open a second transaction, nor call Process, while the
// goroutine holds one: on SQLite (one writer at a time) that would wait for
// itself.

func txCases[TTx any]() []testCase[TTx] {
	return []testCase[TTx]{
		{"JoinsCallerTx", testJoinsCallerTx[TTx]},
		{"DuplicateKeepsTxUsable", testDuplicateKeepsTxUsable[TTx]},
		{"SameMessageTwiceInOneTx", testSameMessageTwiceInOneTx[TTx]},
		{"ManyMessagesInOneTx", testManyMessagesInOneTx[TTx]},
		{"HandlerErrorCallerRollsBack", testProcessTxHandlerError[TTx]},
	}
}

// ProcessTx claims in the caller's transaction: rolling it back forgets
// the claim and the handler's effects; committing it keeps them with the
// caller's own writes.
func testJoinsCallerTx[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	var calls atomic.Int64
	h := b.handler(c, &calls)
	m1 := idem.Message{ID: "m-1", Payload: []byte("p")}

	tx := b.begin()
	out, err := c.ProcessTx(b.ctx, tx, m1, h)
	b.wantOutcome("ProcessTx in a transaction the caller then rolls back", m1.ID, out, err, idem.Processed, nil)
	b.rollback(tx)
	b.wantRecords("after the caller's rollback", c.Name(), 0)
	b.wantEffects("after the caller's rollback", c.Name(), m1.ID, 0)
	b.process("Process after the caller's rollback", c, m1, h, idem.Processed, nil)

	m2 := idem.Message{ID: "m-2", Payload: []byte("p")}
	own := b.name("callers-own-write")
	tx = b.begin()
	if err := b.s.WriteEffect(b.ctx, tx, own); err != nil {
		t.Fatalf("WriteEffect: %v", err)
	}
	out, err = c.ProcessTx(b.ctx, tx, m2, h)
	b.wantOutcome("ProcessTx in a transaction the caller then commits", m2.ID, out, err, idem.Processed, nil)
	b.commit(tx)
	b.wantEffectKey("the caller's own write", own, 1)
	b.wantEffects("after the caller's commit", c.Name(), m2.ID, 1)
	b.wantRecords("after the caller's commit", c.Name(), 2)
	b.process("redelivery after the caller's commit", c, m2, h, idem.Duplicate, nil)
	b.wantCalls("ProcessTx", &calls, 3)
}

// a duplicate claimed inside the caller's transaction does
// not abort it. The caller writes before and after the duplicate ProcessTx
// in the same transaction, commits, and both writes are there. (On
// PostgreSQL a caught unique violation would have aborted the transaction.)
func testDuplicateKeepsTxUsable[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	var calls atomic.Int64
	h := b.handler(c, &calls)
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}
	b.process("first delivery", c, msg, h, idem.Processed, nil)

	before, after := b.name("before-the-duplicate"), b.name("after-the-duplicate")
	tx := b.begin()
	if err := b.s.WriteEffect(b.ctx, tx, before); err != nil {
		t.Fatalf("WriteEffect before the duplicate: %v", err)
	}
	out, err := c.ProcessTx(b.ctx, tx, msg, h)
	b.wantOutcome("ProcessTx of a processed message", msg.ID, out, err, idem.Duplicate, nil)
	if err := b.s.WriteEffect(b.ctx, tx, after); err != nil {
		t.Errorf("WriteEffect after a duplicate ProcessTx in the same transaction: %v (the duplicate aborted the transaction)", err)
	}
	if err := b.s.Store.Commit(b.ctx, tx); err != nil {
		t.Errorf("Commit after a duplicate ProcessTx: %v (the duplicate aborted the transaction)", err)
		_ = b.s.Store.Rollback(b.ctx, tx)
	}
	b.wantEffectKey("the write before the duplicate", before, 1)
	b.wantEffectKey("the write after the duplicate", after, 1)
	b.wantCalls("after the duplicate", &calls, 1)
	b.wantEffects("after the duplicate", c.Name(), msg.ID, 1)
	b.wantRecords("after the duplicate", c.Name(), 1)
}

// A message claimed twice in one transaction (two copies in one unit of
// work) runs once: the second ProcessTx sees the transaction's own claim.
func testSameMessageTwiceInOneTx[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	var calls atomic.Int64
	h := b.handler(c, &calls)
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}

	tx := b.begin()
	out, err := c.ProcessTx(b.ctx, tx, msg, h)
	b.wantOutcome("first ProcessTx", msg.ID, out, err, idem.Processed, nil)
	out, err = c.ProcessTx(b.ctx, tx, msg, h)
	b.wantOutcome("second ProcessTx of the same message in the same transaction", msg.ID, out, err, idem.Duplicate, nil)
	out, err = c.ProcessTx(b.ctx, tx, idem.Message{ID: msg.ID, Payload: []byte("other")}, h)
	b.wantOutcome("ProcessTx of the same ID with another payload in the same transaction", msg.ID, out, err, idem.FingerprintMismatch, idem.ErrFingerprintMismatch)
	after := b.name("after")
	if err := b.s.WriteEffect(b.ctx, tx, after); err != nil {
		t.Errorf("WriteEffect after the in-transaction duplicates: %v", err)
	}
	b.commit(tx)
	b.wantEffectKey("write after the in-transaction duplicates", after, 1)
	b.wantCalls("same message twice in one transaction", &calls, 1)
	b.wantEffects("same message twice in one transaction", c.Name(), msg.ID, 1)
	b.wantRecords("same message twice in one transaction", c.Name(), 1)
}

// Several messages processed in one caller transaction commit together.
func testManyMessagesInOneTx[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	var calls atomic.Int64
	h := b.handler(c, &calls)
	ms := msgs("m-", 5)
	tx := b.begin()
	for _, m := range ms {
		out, err := c.ProcessTx(b.ctx, tx, m, h)
		b.wantOutcome(fmt.Sprintf("ProcessTx %q", m.ID), m.ID, out, err, idem.Processed, nil)
	}
	b.commit(tx)
	b.wantRecords("after the caller commits", c.Name(), len(ms))
	for _, m := range ms {
		b.wantEffects("after the caller commits", c.Name(), m.ID, 1)
		b.process(fmt.Sprintf("redelivery of %q", m.ID), c, m, h, idem.Duplicate, nil)
	}
	b.wantCalls("many messages in one transaction", &calls, int64(len(ms)))
}

// A handler error in ProcessTx is returned; the caller rolls back, and a
// later delivery processes the message.
func testProcessTxHandlerError[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	var calls atomic.Int64
	ok := b.handler(c, &calls)
	failing := func(ctx context.Context, tx TTx, m idem.Message) error {
		if err := ok(ctx, tx, m); err != nil {
			return err
		}
		return errBoom
	}
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}
	own := b.name("callers-own-write")
	tx := b.begin()
	if err := b.s.WriteEffect(b.ctx, tx, own); err != nil {
		t.Fatalf("WriteEffect: %v", err)
	}
	out, err := c.ProcessTx(b.ctx, tx, msg, failing)
	b.wantOutcome("ProcessTx with a failing handler", msg.ID, out, err, idem.Failed, errBoom)
	b.rollback(tx)
	b.wantEffectKey("the caller's write, rolled back", own, 0)
	b.wantEffects("after the caller's rollback", c.Name(), msg.ID, 0)
	b.wantRecords("after the caller's rollback", c.Name(), 0)

	tx = b.begin()
	out, err = c.ProcessTx(b.ctx, tx, msg, ok)
	b.wantOutcome("ProcessTx retry", msg.ID, out, err, idem.Processed, nil)
	b.commit(tx)
	b.wantCalls("after the retry", &calls, 2)
	b.wantEffects("after the retry", c.Name(), msg.ID, 1)
	b.wantRecords("after the retry", c.Name(), 1)
}

package idemtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
)

// concurrency is how many copies of one message the concurrent cases
// release at once.
const concurrency = 32

func processCases[TTx any]() []testCase[TTx] {
	return []testCase[TTx]{
		{"NewThenRedelivery", testNewThenRedelivery[TTx]},
		{"HandlerErrorRollsBack", testHandlerErrorRollsBack[TTx]},
		{"HandlerPanicRollsBack", testHandlerPanicRollsBack[TTx]},
		{"HandlerPanicWithError", testHandlerPanicWithError[TTx]},
		{"ConcurrentSameMessage", testConcurrentSameMessage[TTx]},
		{"ConcurrentFirstHandlerFails", testConcurrentFirstHandlerFails[TTx]},
		{"ConcurrentDistinctMessages", testConcurrentDistinctMessages[TTx]},
		{"ContextCancelledBefore", testContextCancelledBefore[TTx]},
		{"ContextCancelledInHandler", testContextCancelledInHandler[TTx]},
	}
}

// A new message is processed once; every redelivery is a Duplicate that
// does not call the handler.
func testNewThenRedelivery[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	var calls atomic.Int64
	h := b.handler(c, &calls)
	msg := idem.Message{ID: "order-1", Payload: []byte(`{"amount":200}`)}

	b.process("first delivery", c, msg, h, idem.Processed, nil)
	b.wantCalls("after the first delivery", &calls, 1)
	b.wantEffects("after the first delivery", c.Name(), msg.ID, 1)
	b.wantRecords("after the first delivery", c.Name(), 1)

	for i := range 3 {
		what := fmt.Sprintf("redelivery %d", i+1)
		out := b.process(what, c, msg, h, idem.Duplicate, nil)
		if out.MismatchAccepted {
			t.Errorf("%s: MismatchAccepted = true for an identical payload", what)
		}
	}
	b.wantCalls("after 3 redeliveries", &calls, 1)
	b.wantEffects("after 3 redeliveries", c.Name(), msg.ID, 1)
	b.wantRecords("after 3 redeliveries", c.Name(), 1)
}

// A handler error rolls back the claim and the effects it wrote; the
// redelivery runs the handler again and commits.
func testHandlerErrorRollsBack[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	var calls atomic.Int64
	ok := b.handler(c, &calls)
	failing := func(ctx context.Context, tx TTx, msg idem.Message) error {
		if err := ok(ctx, tx, msg); err != nil {
			return err
		}
		return errBoom // after writing the effect: it must be rolled back
	}
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}

	out := b.process("failing delivery", c, msg, failing, idem.Failed, errBoom)
	if out.DeadLetter() || idem.IsPermanent(out.Err) {
		t.Errorf("failing delivery: DeadLetter() = %v, IsPermanent = %v, want both false (a handler error is retryable)",
			out.DeadLetter(), idem.IsPermanent(out.Err))
	}
	b.wantEffects("after the handler error", c.Name(), msg.ID, 0)
	b.wantRecords("after the handler error", c.Name(), 0)

	b.process("redelivery", c, msg, ok, idem.Processed, nil)
	b.process("second redelivery", c, msg, ok, idem.Duplicate, nil)
	b.wantCalls("after the redeliveries", &calls, 2)
	b.wantEffects("after the redeliveries", c.Name(), msg.ID, 1)
	b.wantRecords("after the redeliveries", c.Name(), 1)
}

// A handler panic becomes a *idem.PanicError matching ErrHandlerPanic, and
// rolls back like an error.
func testHandlerPanicRollsBack[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	var calls atomic.Int64
	ok := b.handler(c, &calls)
	panicking := func(ctx context.Context, tx TTx, msg idem.Message) error {
		if err := ok(ctx, tx, msg); err != nil {
			return err
		}
		panic("boom")
	}
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}

	out := b.process("panicking delivery", c, msg, panicking, idem.Failed, idem.ErrHandlerPanic)
	var pe *idem.PanicError
	switch {
	case !errors.As(out.Err, &pe):
		t.Errorf("panicking delivery: err = %v (%T), want a *idem.PanicError in its chain", out.Err, out.Err)
	case pe.Value != "boom":
		t.Errorf("panicking delivery: PanicError.Value = %v, want %q", pe.Value, "boom")
	case len(pe.Stack) == 0:
		t.Errorf("panicking delivery: PanicError.Stack is empty")
	}
	b.wantEffects("after the panic", c.Name(), msg.ID, 0)
	b.wantRecords("after the panic", c.Name(), 0)

	b.process("redelivery", c, msg, ok, idem.Processed, nil)
	b.wantCalls("after the redelivery", &calls, 2)
	b.wantEffects("after the redelivery", c.Name(), msg.ID, 1)
	b.wantRecords("after the redelivery", c.Name(), 1)
}

// panic(err) keeps err reachable with errors.Is.
func testHandlerPanicWithError[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	var calls atomic.Int64
	ok := b.handler(c, &calls)
	panicking := func(ctx context.Context, tx TTx, msg idem.Message) error {
		if err := ok(ctx, tx, msg); err != nil {
			return err
		}
		panic(errBoom)
	}
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}
	out := b.process("panic(err) delivery", c, msg, panicking, idem.Failed, idem.ErrHandlerPanic)
	if !errors.Is(out.Err, errBoom) {
		t.Errorf("panic(err) delivery: err = %v, want it to match the panic value %v too", out.Err, errBoom)
	}
	b.wantRecords("after the panic", c.Name(), 0)
	b.wantEffects("after the panic", c.Name(), msg.ID, 0)
	b.process("redelivery", c, msg, ok, idem.Processed, nil)
	b.wantEffects("after the redelivery", c.Name(), msg.ID, 1)
}

// race runs fn(i) for i in [0, n) on n goroutines released together by a
// barrier, and waits for them all.
func race(n int, fn func(i int)) {
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			ready.Done()
			<-start
			fn(i)
		}()
	}
	ready.Wait()
	close(start)
	done.Wait()
}

// concurrent copies of one message. Exactly one is
// Processed and runs the handler (whose counter lives outside the
// transaction, like an e-mail or an HTTP call); the others wait for it and
// are Duplicates.
func testConcurrentSameMessage[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	var calls atomic.Int64
	h := b.handler(c, &calls)
	msg := idem.Message{ID: "m-concurrent", Payload: []byte("same payload")}

	outs := make([]idem.Outcome, concurrency)
	errs := make([]error, concurrency)
	race(concurrency, func(i int) { outs[i], errs[i] = c.Process(b.ctx, msg, h) })

	n := statusCounts(outs)
	if n[idem.Processed] != 1 || n[idem.Duplicate] != concurrency-1 {
		t.Errorf("%d concurrent copies: %d Processed and %d Duplicate, want 1 and %d (all: %v)",
			concurrency, n[idem.Processed], n[idem.Duplicate], concurrency-1, n)
	}
	for i, err := range errs {
		if err != nil {
			t.Errorf("copy %d: err = %v, want nil", i, err)
		}
	}
	b.wantCalls("the handler's external counter", &calls, 1)
	b.wantEffects("after the concurrent copies", c.Name(), msg.ID, 1)
	b.wantRecords("after the concurrent copies", c.Name(), 1)
}

// Concurrent copies where the first handler to run fails: its claim is
// rolled back, a waiting copy takes over, and exactly one effect commits.
// Copies may fail with ErrStore (a deadlock victim on some databases) but
// never run the handler twice successfully.
func testConcurrentFirstHandlerFails[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	var calls, succeeded atomic.Int64
	h := func(ctx context.Context, tx TTx, msg idem.Message) error {
		if calls.Add(1) == 1 {
			return errBoom
		}
		if err := b.s.WriteEffect(ctx, tx, key(c.Name(), msg.ID)); err != nil {
			return err
		}
		succeeded.Add(1)
		return nil
	}
	msg := idem.Message{ID: "m-first-fails", Payload: []byte("same payload")}

	outs := make([]idem.Outcome, concurrency)
	race(concurrency, func(i int) { outs[i], _ = c.Process(b.ctx, msg, h) })

	var processed, boom, storeErrs, other int
	for _, o := range outs {
		switch {
		case o.Status == idem.Processed:
			processed++
		case o.Status == idem.Duplicate:
		case o.Status == idem.Failed && errors.Is(o.Err, errBoom):
			boom++
		case o.Status == idem.Failed && errors.Is(o.Err, idem.ErrStore):
			storeErrs++
			t.Logf("a copy failed with a store error (allowed, retryable): %v", o.Err)
		default:
			other++
			t.Errorf("unexpected outcome %v (err: %v)", o.Status, o.Err)
		}
	}
	if processed != 1 || boom != 1 {
		t.Errorf("%d concurrent copies, the first handler failing: %d Processed and %d failed with the handler error, want 1 and 1",
			concurrency, processed, boom)
	}
	if got := succeeded.Load(); got != 1 {
		t.Errorf("successful handler runs = %d, want 1", got)
	}
	b.wantEffects("after the concurrent copies", c.Name(), msg.ID, 1)
	b.wantRecords("after the concurrent copies", c.Name(), 1)
	b.process("redelivery", c, msg, h, idem.Duplicate, nil)
}

// Many distinct messages at once: each is processed once.
func testConcurrentDistinctMessages[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	var calls atomic.Int64
	h := b.handler(c, &calls)
	ms := msgs("m-", concurrency)
	outs := make([]idem.Outcome, concurrency)
	errs := make([]error, concurrency)
	race(concurrency, func(i int) { outs[i], errs[i] = c.Process(b.ctx, ms[i], h) })
	for i := range ms {
		b.wantOutcome(fmt.Sprintf("message %q", ms[i].ID), ms[i].ID, outs[i], errs[i], idem.Processed, nil)
	}
	b.wantCalls("after the deliveries", &calls, concurrency)
	b.wantRecords("after the deliveries", c.Name(), concurrency)
	for _, m := range ms {
		b.wantEffects("after the deliveries", c.Name(), m.ID, 1)
	}
}

// A context that ended before the call: nothing runs, nothing is recorded,
// the error says why, and a later delivery processes the message.
func testContextCancelledBefore[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	var calls atomic.Int64
	h := b.handler(c, &calls)
	ctx, cancel := context.WithCancel(b.ctx)
	cancel()
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}

	out, err := c.Process(ctx, msg, h)
	b.wantOutcome("Process with a cancelled context", msg.ID, out, err, idem.Failed, context.Canceled)
	if idem.IsPermanent(err) {
		t.Errorf("Process with a cancelled context: IsPermanent(%v) = true, want false", err)
	}

	batch := msgs("b-", 2)
	bh := b.batchHandler(c, &batchCalls{})
	outs, err := c.ProcessBatch(ctx, batch, bh)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("ProcessBatch with a cancelled context: err = %v, want an error matching context.Canceled", err)
	}
	for i, o := range outs {
		b.wantOutcome("ProcessBatch with a cancelled context", batch[i].ID, o, o.Err, idem.Failed, context.Canceled)
	}

	tx := b.begin()
	out, err = c.ProcessTx(ctx, tx, msg, h)
	b.wantOutcome("ProcessTx with a cancelled context", msg.ID, out, err, idem.Failed, context.Canceled)
	b.rollback(tx)

	b.wantCalls("after the cancelled calls", &calls, 0)
	b.wantRecords("after the cancelled calls", c.Name(), 0)
	b.wantEffects("after the cancelled calls", c.Name(), msg.ID, 0)

	b.process("later delivery", c, msg, h, idem.Processed, nil)
	b.wantRecords("after the later delivery", c.Name(), 1)
	b.wantEffects("after the later delivery", c.Name(), msg.ID, 1)
}

// The context ends while the handler runs. A handler that returns the
// context's error fails the delivery and rolls back. A handler that returns
// nil anyway leaves an outcome that must match the store: Processed with the
// record and effect committed, or Failed with neither.
func testContextCancelledInHandler[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	var calls atomic.Int64
	ok := b.handler(c, &calls)

	ctx, cancel := context.WithCancel(b.ctx)
	msg := idem.Message{ID: "m-returns-ctx-err", Payload: []byte("p")}
	out, err := c.Process(ctx, msg, func(ctx context.Context, tx TTx, m idem.Message) error {
		if err := ok(ctx, tx, m); err != nil {
			return err
		}
		cancel()
		return ctx.Err()
	})
	b.wantOutcome("handler returning the cancelled context's error", msg.ID, out, err, idem.Failed, context.Canceled)
	b.wantRecords("after the cancelled handler", c.Name(), 0)
	b.wantEffects("after the cancelled handler", c.Name(), msg.ID, 0)
	b.process("redelivery", c, msg, ok, idem.Processed, nil)
	b.wantEffects("after the redelivery", c.Name(), msg.ID, 1)

	ctx, cancel = context.WithCancel(b.ctx)
	msg2 := idem.Message{ID: "m-returns-nil", Payload: []byte("p")}
	out, err = c.Process(ctx, msg2, func(ctx context.Context, tx TTx, m idem.Message) error {
		if err := ok(ctx, tx, m); err != nil {
			return err
		}
		cancel()
		return nil
	})
	records, cerr := b.s.CountRecords(b.ctx, c.Name())
	if cerr != nil {
		t.Fatalf("CountRecords: %v", cerr)
	}
	effects, cerr := b.s.CountEffects(b.ctx, key(c.Name(), msg2.ID))
	if cerr != nil {
		t.Fatalf("CountEffects: %v", cerr)
	}
	switch out.Status {
	case idem.Processed:
		if err != nil || records != 2 || effects != 1 {
			t.Errorf("context cancelled before commit: Processed (err %v) with %d records and %d effects, want nil, 2 and 1", err, records, effects)
		}
		b.process("redelivery after a committed delivery", c, msg2, ok, idem.Duplicate, nil)
	case idem.Failed:
		if err == nil || records != 1 || effects != 0 {
			t.Errorf("context cancelled before commit: Failed (err %v) with %d records and %d effects, want an error, 1 and 0", err, records, effects)
		}
		b.process("redelivery after a failed delivery", c, msg2, ok, idem.Processed, nil)
	default:
		t.Errorf("context cancelled before commit: status %v (err %v), want Processed or Failed", out.Status, err)
	}
	b.wantEffects("after the redelivery", c.Name(), msg2.ID, 1)
}

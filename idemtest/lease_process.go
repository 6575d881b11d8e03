package idemtest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

func leaseProcessCases() []leaseCase {
	return []leaseCase{
		{"ClaimCompleteReplay", testLeaseReplay},
		{"ConcurrentSameMessage", testLeaseConcurrentSameMessage},
		{"ConcurrentDistinctMessages", testLeaseConcurrentDistinct},
		{"HandlerPanicReleases", testLeaseHandlerPanic},
		{"ContextCancelledBefore", testLeaseContextCancelledBefore},
		{"ContextCancelledInHandler", testLeaseContextCancelledInHandler},
		{"InvalidIDs", testLeaseInvalidIDs},
		{"IDsByteForByte", testLeaseIDsByteForByte},
		{"TwoConsumersSameMessage", testLeaseTwoConsumers},
	}
}

// A new message is Processed with the handler's Result; every redelivery is
// a Duplicate that replays the stored result and content type byte for
// byte (binary, empty, 1 MiB) without calling the handler, also from a new
// LeaseConsumer value (as after a restart: nothing is cached).
func testLeaseReplay(t *testing.T, b *leaseBundle) {
	results := []struct {
		name string
		res  idem.Result
	}{
		{"JSON", idem.Result{Body: []byte(`{"id":"r-1","amount":200}`), ContentType: "application/json"}},
		{"every byte value", idem.Result{Body: everyByte(), ContentType: "application/octet-stream"}},
		{"nil body, no content type", idem.Result{}},
		{"empty body", idem.Result{Body: []byte{}, ContentType: "text/plain; charset=utf-8"}},
		{"1 MiB", idem.Result{Body: mib(), ContentType: "application/octet-stream"}},
		{"NULs, invalid UTF-8, trailing space", idem.Result{Body: []byte("\x00a\xff\xfe\x00 "), ContentType: "application/vnd.example+json; version=2"}},
	}
	c := b.consumer("c", idem.Config{})
	calls := make([]atomic.Int64, len(results))
	ms := make([]idem.Message, len(results))
	for i, r := range results {
		ms[i] = idem.Message{ID: fmt.Sprintf("m-%d", i), Payload: []byte("payload of " + r.name)}
		h := result(&calls[i], r.res)
		out := b.process(r.name+": first delivery", c, ms[i], h, idem.Processed, nil)
		b.wantResult(r.name+": Processed", out.Result, out.ContentType, r.res)
		b.wantAttempt(r.name+": Processed", out, 1)
		for j := range 2 {
			what := fmt.Sprintf("%s: redelivery %d", r.name, j+1)
			out := b.process(what, c, ms[i], h, idem.Duplicate, nil)
			b.wantResult(what, out.Result, out.ContentType, r.res)
			if out.MismatchAccepted {
				b.t.Errorf("%s: MismatchAccepted = true for an identical payload", what)
			}
		}
	}
	again := b.consumer("c", idem.Config{})
	for i, r := range results {
		out := b.process(r.name+": redelivery to a new LeaseConsumer", again, ms[i], result(&calls[i], r.res), idem.Duplicate, nil)
		b.wantResult(r.name+": redelivery to a new LeaseConsumer", out.Result, out.ContentType, r.res)
		b.wantCalls(r.name, &calls[i], 1)

		res := b.acquire(r.name+": Store.Acquire of the completed record", c.Name(), ms[i], longLease)
		b.wantNotAcquired(r.name+": Store.Acquire of the completed record", res, idemdriver.StateCompleted)
		b.wantResult(r.name+": AcquireResult", res.Result, res.ContentType, r.res)
	}
	b.wantRecords("after the deliveries", c.Name(), len(results))
}

// Copies of one message delivered at once while the first handler is
// running (blocked): exactly one runs the handler; every other copy returns
// InProgress at once, with ErrInProgress, a RetryAfter within the lease,
// and no ack. After completion, copies are
// Duplicates.
func testLeaseConcurrentSameMessage(t *testing.T, b *leaseBundle) {
	c := b.consumer("c", idem.Config{})
	msg := idem.Message{ID: "m-concurrent", Payload: []byte("same payload")}
	want := idem.Result{Body: []byte("done"), ContentType: "text/plain"}
	var calls atomic.Int64
	release := make(chan struct{})
	h := func(ctx context.Context, a *idem.Attempt) (idem.Result, error) {
		if calls.Add(1) == 1 { // a second run (a bug) returns at once, so the case fails fast
			hold(ctx, release)
		}
		return want, nil
	}

	outs := make([]idem.Outcome, concurrency)
	errs := make([]error, concurrency)
	returned := make(chan struct{}, concurrency)
	finished := make(chan struct{})
	go func() {
		race(concurrency, func(i int) {
			outs[i], errs[i] = c.Process(b.ctx, msg, h)
			returned <- struct{}{}
		})
		close(finished)
	}()
	for n := range concurrency - 1 {
		if _, ok := await(t, returned, fmt.Sprintf("copy %d of %d returning while the first handler runs", n+1, concurrency-1)); !ok {
			break
		}
	}
	close(release)
	waitFor(t, finished, "the concurrent copies")

	n := statusCounts(outs)
	if n[idem.Processed] != 1 || n[idem.InProgress] != concurrency-1 {
		t.Errorf("%d concurrent copies, the handler held: %d Processed and %d InProgress, want 1 and %d (all: %v)",
			concurrency, n[idem.Processed], n[idem.InProgress], concurrency-1, n)
	}
	for i, o := range outs {
		what := fmt.Sprintf("copy %d", i)
		switch o.Status {
		case idem.Processed:
			b.wantOutcome(what, msg.ID, o, errs[i], idem.Processed, nil)
			b.wantResult(what, o.Result, o.ContentType, want)
		case idem.InProgress:
			b.wantOutcome(what, msg.ID, o, errs[i], idem.InProgress, idem.ErrInProgress)
			if o.RetryAfter > longLease || o.DeadLetter() || idem.IsPermanent(o.Err) {
				t.Errorf("%s: InProgress with RetryAfter %v, DeadLetter %v, IsPermanent %v; want RetryAfter in (0, %v] and both false",
					what, o.RetryAfter, o.DeadLetter(), idem.IsPermanent(o.Err), longLease)
			}
			b.wantAttempt(what+" (attempts so far)", o, 1)
		}
	}
	b.wantCalls("the handler's external counter", &calls, 1)
	for i := range 3 {
		out := b.process(fmt.Sprintf("redelivery %d after completion", i+1), c, msg, h, idem.Duplicate, nil)
		b.wantResult("redelivery after completion", out.Result, out.ContentType, want)
	}
	b.wantCalls("after the redeliveries", &calls, 1)
	b.wantRecords("after the concurrent copies", c.Name(), 1)
}

// Many distinct messages at once: each is processed once, as attempt 1.
func testLeaseConcurrentDistinct(t *testing.T, b *leaseBundle) {
	c := b.consumer("c", idem.Config{})
	ms := msgs("m-", concurrency)
	var calls atomic.Int64
	outs := make([]idem.Outcome, concurrency)
	errs := make([]error, concurrency)
	race(concurrency, func(i int) {
		outs[i], errs[i] = c.Process(b.ctx, ms[i], func(_ context.Context, a *idem.Attempt) (idem.Result, error) {
			calls.Add(1)
			return idem.Result{Body: []byte(a.Message.ID)}, nil
		})
	})
	for i, m := range ms {
		what := fmt.Sprintf("message %q", m.ID)
		b.wantOutcome(what, m.ID, outs[i], errs[i], idem.Processed, nil)
		b.wantAttempt(what, outs[i], 1)
		b.wantResult(what, outs[i].Result, outs[i].ContentType, idem.Result{Body: []byte(m.ID)})
	}
	b.wantCalls("after the deliveries", &calls, concurrency)
	b.wantRecords("after the deliveries", c.Name(), concurrency)
}

// A panic releases the lease like a retryable error: Failed with a
// *idem.PanicError matching ErrHandlerPanic (and the panic value when it
// is an error), not poison; the record stays and the next delivery runs as
// attempt 2.
func testLeaseHandlerPanic(t *testing.T, b *leaseBundle) {
	c := b.consumer("c", idem.Config{})
	var calls atomic.Int64
	ok := result(&calls, idem.Result{Body: []byte("ok")})
	for _, tt := range []struct {
		name  string
		value any
	}{{"panic(string)", "boom"}, {"panic(error)", errBoom}} {
		msg := idem.Message{ID: "m-" + tt.name, Payload: []byte("p")}
		out := b.process(tt.name, c, msg, func(context.Context, *idem.Attempt) (idem.Result, error) {
			calls.Add(1)
			panic(tt.value)
		}, idem.Failed, idem.ErrHandlerPanic)
		var pe *idem.PanicError
		switch {
		case !errors.As(out.Err, &pe):
			t.Errorf("%s: err = %v (%T), want a *idem.PanicError in its chain", tt.name, out.Err, out.Err)
		case pe.Value != tt.value:
			t.Errorf("%s: PanicError.Value = %v, want %v", tt.name, pe.Value, tt.value)
		case len(pe.Stack) == 0:
			t.Errorf("%s: PanicError.Stack is empty", tt.name)
		}
		if e, isErr := tt.value.(error); isErr && !errors.Is(out.Err, e) {
			t.Errorf("%s: err = %v, want it to match the panic value %v too", tt.name, out.Err, e)
		}
		b.wantPoison(tt.name, out, false)
		b.wantAttempt(tt.name, out, 1)
		out = b.process(tt.name+": redelivery", c, msg, ok, idem.Processed, nil)
		b.wantAttempt(tt.name+": redelivery", out, 2)
	}
	b.wantCalls("after the panics and redeliveries", &calls, 4)
	b.wantRecords("after the panics and redeliveries", c.Name(), 2)
}

// A context that ended before the call: the handler does not run, no
// record is written, the error matches context.Canceled and is retryable,
// and a later delivery is attempt 1.
func testLeaseContextCancelledBefore(t *testing.T, b *leaseBundle) {
	c := b.consumer("c", idem.Config{})
	var calls atomic.Int64
	h := result(&calls, idem.Result{Body: []byte("ok")})
	ctx, cancel := context.WithCancel(b.ctx)
	cancel()
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}
	out, err := c.Process(ctx, msg, h)
	b.wantOutcome("Process with a cancelled context", msg.ID, out, err, idem.Failed, context.Canceled)
	b.wantPoison("Process with a cancelled context", out, false)
	b.wantCalls("after the cancelled call", &calls, 0)
	b.wantRecords("after the cancelled call", c.Name(), 0)

	out = b.process("later delivery", c, msg, h, idem.Processed, nil)
	b.wantAttempt("later delivery", out, 1)
	b.wantRecords("after the later delivery", c.Name(), 1)
}

// The caller's context ends while the handler runs. A handler that returns
// the context's error releases the lease (retryable; the next delivery is
// attempt 2). A handler that returns a Result anyway has it stored: the
// completion uses a context detached from the caller's, so a caller that
// gave up does not lose a result whose effects happened.
func testLeaseContextCancelledInHandler(t *testing.T, b *leaseBundle) {
	c := b.consumer("c", idem.Config{})
	var calls atomic.Int64
	ok := result(&calls, idem.Result{Body: []byte("ok")})

	ctx, cancel := context.WithCancel(b.ctx)
	msg := idem.Message{ID: "m-returns-ctx-err", Payload: []byte("p")}
	out, err := c.Process(ctx, msg, func(ctx context.Context, _ *idem.Attempt) (idem.Result, error) {
		calls.Add(1)
		cancel()
		return idem.Result{}, ctx.Err()
	})
	b.wantOutcome("handler returning the cancelled context's error", msg.ID, out, err, idem.Failed, context.Canceled)
	b.wantPoison("handler returning the cancelled context's error", out, false)
	b.wantRecords("after the cancelled handler", c.Name(), 1)
	out = b.process("redelivery", c, msg, ok, idem.Processed, nil)
	b.wantAttempt("redelivery", out, 2)

	ctx, cancel = context.WithCancel(b.ctx)
	defer cancel()
	msg2 := idem.Message{ID: "m-returns-result", Payload: []byte("p")}
	want := idem.Result{Body: []byte("done after cancel"), ContentType: "text/plain"}
	out, err = c.Process(ctx, msg2, func(context.Context, *idem.Attempt) (idem.Result, error) {
		calls.Add(1)
		cancel()
		return want, nil
	})
	b.wantOutcome("handler returning a result after the caller's context ended", msg2.ID, out, err, idem.Processed, nil)
	out = b.process("redelivery of the completed message", c, msg2, ok, idem.Duplicate, nil)
	b.wantResult("redelivery of the completed message", out.Result, out.ContentType, want)
	b.wantCalls("after the deliveries", &calls, 3)
}

// Invalid message IDs are Rejected before the store is touched: no handler
// call, no record.
func testLeaseInvalidIDs(t *testing.T, b *leaseBundle) {
	c := b.consumer("c", idem.Config{})
	var calls atomic.Int64
	h := result(&calls, idem.Result{Body: []byte("ok")})
	for _, tt := range []struct {
		name, id string
		want     error
	}{
		{"empty", "", idem.ErrMissingMessageID},
		{"256 bytes", strings.Repeat("a", 256), idem.ErrInvalidMessageID},
		{"NUL", "a\x00b", idem.ErrInvalidMessageID},
		{"newline", "a\nb", idem.ErrInvalidMessageID},
		{"DEL", "a\x7fb", idem.ErrInvalidMessageID},
		{"invalid UTF-8", "a\xffb", idem.ErrInvalidMessageID},
	} {
		out := b.process("ID "+tt.name, c, idem.Message{ID: tt.id, Payload: []byte("p")}, h, idem.Rejected, tt.want)
		if !out.DeadLetter() {
			t.Errorf("ID %s: DeadLetter() = false, want true", tt.name)
		}
	}
	b.wantCalls("after the invalid IDs", &calls, 0)
	b.wantRecords("after the invalid IDs", c.Name(), 0)
}

// IDs are compared byte for byte in lease mode too, and 255-byte IDs are
// kept whole.
func testLeaseIDsByteForByte(t *testing.T, b *leaseBundle) {
	pairs := []struct{ name, a, b string }{
		{"case", "Order-1", "order-1"},
		{"trailing space", "a", "a "},
		{"NFC vs NFD", "\u00e9", "e\u0301"},
		{"full width", "A", "\uff21"},
		{"LIKE wildcards", "50%", "50_"},
		{"key separators", "a:b", "a|b"},
		{"last byte of 255", strings.Repeat("x", 254) + "1", strings.Repeat("x", 254) + "2"},
	}
	for i, p := range pairs {
		c := b.consumer(fmt.Sprintf("pair%d", i), idem.Config{})
		var calls atomic.Int64
		h := func(_ context.Context, a *idem.Attempt) (idem.Result, error) {
			calls.Add(1)
			return idem.Result{Body: []byte(a.Message.ID)}, nil
		}
		for _, id := range []string{p.a, p.b} {
			b.process(fmt.Sprintf("%s: first delivery of %q", p.name, id), c, idem.Message{ID: id, Payload: []byte("same")}, h, idem.Processed, nil)
		}
		for _, id := range []string{p.a, p.b} {
			what := fmt.Sprintf("%s: redelivery of %q", p.name, id)
			out := b.process(what, c, idem.Message{ID: id, Payload: []byte("same")}, h, idem.Duplicate, nil)
			b.wantResult(what, out.Result, out.ContentType, idem.Result{Body: []byte(id)})
		}
		b.wantCalls(p.name, &calls, 2)
		b.wantRecords(p.name, c.Name(), 2)
	}
}

// consumers of one event (names compared
// byte for byte) each process it once, and keep their own results.
func testLeaseTwoConsumers(t *testing.T, b *leaseBundle) {
	names := []string{"billing", "shipping", "Billing"}
	msg := idem.Message{ID: "event-1", Payload: []byte("payload")}
	cs := make([]*idem.LeaseConsumer, len(names))
	calls := make([]atomic.Int64, len(names))
	for i, n := range names {
		cs[i] = b.consumer(n, idem.Config{})
		b.process(fmt.Sprintf("consumer %q, first delivery", n), cs[i], msg, result(&calls[i], idem.Result{Body: []byte(n)}), idem.Processed, nil)
	}
	for i, n := range names {
		what := fmt.Sprintf("consumer %q, redelivery", n)
		out := b.process(what, cs[i], msg, result(&calls[i], idem.Result{Body: []byte(n)}), idem.Duplicate, nil)
		b.wantResult(what, out.Result, out.ContentType, idem.Result{Body: []byte(n)})
		b.wantCalls(fmt.Sprintf("consumer %q", n), &calls[i], 1)
		b.wantRecords(fmt.Sprintf("consumer %q", n), cs[i].Name(), 1)
	}
	// Fingerprints are per consumer: another consumer receiving the ID with
	// another payload processes it.
	other := b.consumer("audit", idem.Config{})
	var oc atomic.Int64
	b.process("consumer \"audit\", same ID with another payload", other,
		idem.Message{ID: msg.ID, Payload: []byte("another payload")}, result(&oc, idem.Result{}), idem.Processed, nil)
}

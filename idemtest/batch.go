package idemtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/idem-go/idem"
)

func batchCases[TTx any]() []testCase[TTx] {
	return []testCase[TTx]{
		{"Mixed", testBatchMixed[TTx]},
		{"HandlerErrorRollsBack", testBatchHandlerError[TTx]},
		{"HandlerPanicRollsBack", testBatchHandlerPanic[TTx]},
		{"AllDuplicates", testBatchAllDuplicates[TTx]},
		{"EmptyAndAllInvalid", testBatchEmptyAndInvalid[TTx]},
		{"ConcurrentOverlapping", testBatchConcurrentOverlapping[TTx]},
	}
}

type wantOut struct {
	s   idem.Status
	err error
}

// checkBatch checks a batch's outcomes, one per message, in order.
func (b *bundle[TTx]) checkBatch(what string, batch []idem.Message, outs []idem.Outcome, want []wantOut) {
	b.t.Helper()
	if len(outs) != len(batch) {
		b.t.Fatalf("%s: %d outcomes for %d messages", what, len(outs), len(batch))
	}
	for i, w := range want {
		b.wantOutcome(fmt.Sprintf("%s, message %d (%q)", what, i, batch[i].ID), batch[i].ID, outs[i], outs[i].Err, w.s, w.err)
	}
}

// wantHandlerCalls checks the IDs a batch handler was called with.
func wantHandlerCalls(t *testing.T, what string, calls *batchCalls, want ...[]string) {
	t.Helper()
	got := calls.ids()
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("%s: handler calls %q, want %q", what, got, want)
	}
}

// A batch mixing new messages, one processed earlier, invalid IDs and
// repeats within the batch: per-message outcomes in order; the handler runs
// once, with only the new messages, in delivery order.
func testBatchMixed[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	var bc batchCalls
	h := b.batchHandler(c, &bc)
	old := idem.Message{ID: "old", Payload: []byte("old payload")}
	if outs, err := c.ProcessBatch(b.ctx, []idem.Message{old}, h); err != nil || outs[0].Status != idem.Processed {
		t.Fatalf("processing %q first: %v, %v", old.ID, outs, err)
	}

	batch := []idem.Message{
		{ID: "n-2", Payload: []byte("two")},     // new
		old,                                     // processed before
		{ID: "", Payload: []byte("x")},          // missing ID
		{ID: "bad\x00id", Payload: []byte("x")}, // invalid ID
		{ID: "n-1", Payload: []byte("one")},     // new
		{ID: "n-2", Payload: []byte("two")},     // repeat, same payload
		{ID: "n-1", Payload: []byte("uno")},     // repeat, other payload
		{ID: "old", Payload: []byte("changed")}, // processed before, other payload
		{ID: "n-3", Payload: []byte("three")},   // new
	}
	outs, err := c.ProcessBatch(b.ctx, batch, h)
	b.checkBatch("mixed batch", batch, outs, []wantOut{
		{idem.Processed, nil},
		{idem.Duplicate, nil},
		{idem.Rejected, idem.ErrMissingMessageID},
		{idem.Rejected, idem.ErrInvalidMessageID},
		{idem.Processed, nil},
		{idem.Duplicate, nil},
		{idem.FingerprintMismatch, idem.ErrFingerprintMismatch},
		{idem.FingerprintMismatch, idem.ErrFingerprintMismatch},
		{idem.Processed, nil},
	})
	for _, want := range []error{idem.ErrMissingMessageID, idem.ErrInvalidMessageID, idem.ErrFingerprintMismatch} {
		if !errors.Is(err, want) {
			t.Errorf("mixed batch: err = %v, want it to match %v", err, want)
		}
	}
	wantHandlerCalls(t, "mixed batch", &bc, []string{"old"}, []string{"n-2", "n-1", "n-3"})
	bc.mu.Lock()
	calls := bc.calls
	bc.mu.Unlock()
	if len(calls) == 2 {
		for _, m := range calls[1] {
			want := map[string]string{"n-1": "one", "n-2": "two", "n-3": "three"}[m.ID]
			if string(m.Payload) != want {
				t.Errorf("mixed batch: handler got %q with payload %q, want %q", m.ID, m.Payload, want)
			}
		}
	}
	for _, id := range []string{"old", "n-1", "n-2", "n-3"} {
		b.wantEffects("after the mixed batch", c.Name(), id, 1)
	}
	b.wantRecords("after the mixed batch", c.Name(), 4)

	// A redelivery of the whole batch changes nothing.
	var again batchCalls
	outs, _ = c.ProcessBatch(b.ctx, batch, b.batchHandler(c, &again))
	b.checkBatch("mixed batch redelivered", batch, outs, []wantOut{
		{idem.Duplicate, nil},
		{idem.Duplicate, nil},
		{idem.Rejected, idem.ErrMissingMessageID},
		{idem.Rejected, idem.ErrInvalidMessageID},
		{idem.Duplicate, nil},
		{idem.Duplicate, nil},
		{idem.FingerprintMismatch, idem.ErrFingerprintMismatch},
		{idem.FingerprintMismatch, idem.ErrFingerprintMismatch},
		{idem.Duplicate, nil},
	})
	wantHandlerCalls(t, "mixed batch redelivered", &again)
	b.wantRecords("after the redelivered batch", c.Name(), 4)
}

// A failing batch handler fails every new message and rolls back all their
// claims and effects; messages processed before stay Duplicate; the retry
// processes the new ones.
func testBatchHandlerError[TTx any](t *testing.T, b *bundle[TTx]) {
	testBatchFailure(t, b, func(context.Context, TTx, []idem.Message) error { return errBoom }, errBoom)
}

// A panicking batch handler behaves like a failing one.
func testBatchHandlerPanic[TTx any](t *testing.T, b *bundle[TTx]) {
	testBatchFailure(t, b, func(context.Context, TTx, []idem.Message) error { panic("boom") }, idem.ErrHandlerPanic)
}

func testBatchFailure[TTx any](t *testing.T, b *bundle[TTx], fail func(context.Context, TTx, []idem.Message) error, wantErr error) {
	c := b.consumer("c", idem.Config{})
	var bc batchCalls
	ok := b.batchHandler(c, &bc)
	old := idem.Message{ID: "old", Payload: []byte("p")}
	if outs, err := c.ProcessBatch(b.ctx, []idem.Message{old}, ok); err != nil || outs[0].Status != idem.Processed {
		t.Fatalf("processing %q first: %v, %v", old.ID, outs, err)
	}
	batch := []idem.Message{{ID: "n-1", Payload: []byte("p")}, old, {ID: "n-2", Payload: []byte("p")}, {ID: "n-1", Payload: []byte("p")}}
	failing := func(ctx context.Context, tx TTx, ms []idem.Message) error {
		if err := ok(ctx, tx, ms); err != nil { // writes the effects, then fails
			return err
		}
		return fail(ctx, tx, ms)
	}
	outs, err := c.ProcessBatch(b.ctx, batch, failing)
	if !errors.Is(err, wantErr) {
		t.Errorf("failing batch: err = %v, want it to match %v", err, wantErr)
	}
	b.checkBatch("failing batch", batch, outs, []wantOut{
		{idem.Failed, wantErr}, {idem.Duplicate, nil}, {idem.Failed, wantErr}, {idem.Failed, wantErr},
	})
	b.wantRecords("after the failing batch", c.Name(), 1)
	b.wantEffects("after the failing batch", c.Name(), "n-1", 0)
	b.wantEffects("after the failing batch", c.Name(), "n-2", 0)

	outs, err = c.ProcessBatch(b.ctx, batch, ok)
	if err != nil {
		t.Errorf("retried batch: err = %v, want nil", err)
	}
	b.checkBatch("retried batch", batch, outs, []wantOut{
		{idem.Processed, nil}, {idem.Duplicate, nil}, {idem.Processed, nil}, {idem.Duplicate, nil},
	})
	wantHandlerCalls(t, "failing then retried batch", &bc, []string{"old"}, []string{"n-1", "n-2"}, []string{"n-1", "n-2"})
	b.wantRecords("after the retried batch", c.Name(), 3)
	b.wantEffects("after the retried batch", c.Name(), "n-1", 1)
	b.wantEffects("after the retried batch", c.Name(), "n-2", 1)
	b.wantEffects("after the retried batch", c.Name(), "old", 1)
}

// A batch of messages processed before does not call the handler.
func testBatchAllDuplicates[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	var bc batchCalls
	h := b.batchHandler(c, &bc)
	ms := msgs("m-", 3)
	if _, err := c.ProcessBatch(b.ctx, ms, h); err != nil {
		t.Fatalf("first batch: %v", err)
	}
	batch := append(slices.Clone(ms), ms[0])
	outs, err := c.ProcessBatch(b.ctx, batch, h)
	if err != nil {
		t.Errorf("batch of duplicates: err = %v, want nil", err)
	}
	b.checkBatch("batch of duplicates", batch, outs, []wantOut{{idem.Duplicate, nil}, {idem.Duplicate, nil}, {idem.Duplicate, nil}, {idem.Duplicate, nil}})
	wantHandlerCalls(t, "batch of duplicates", &bc, msgIDs(ms))
	b.wantRecords("after the batch of duplicates", c.Name(), 3)
}

// An empty batch and a batch of invalid messages do nothing.
func testBatchEmptyAndInvalid[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	var bc batchCalls
	h := b.batchHandler(c, &bc)
	outs, err := c.ProcessBatch(b.ctx, nil, h)
	if len(outs) != 0 || err != nil {
		t.Errorf("empty batch: %d outcomes, err %v; want 0 and nil", len(outs), err)
	}
	batch := []idem.Message{{ID: ""}, {ID: "a\nb"}, {ID: strings.Repeat("x", 256)}}
	outs, err = c.ProcessBatch(b.ctx, batch, h)
	if !errors.Is(err, idem.ErrMissingMessageID) || !errors.Is(err, idem.ErrInvalidMessageID) {
		t.Errorf("batch of invalid messages: err = %v, want it to match ErrMissingMessageID and ErrInvalidMessageID", err)
	}
	b.checkBatch("batch of invalid messages", batch, outs, []wantOut{
		{idem.Rejected, idem.ErrMissingMessageID}, {idem.Rejected, idem.ErrInvalidMessageID}, {idem.Rejected, idem.ErrInvalidMessageID},
	})
	wantHandlerCalls(t, "empty and invalid batches", &bc)
	b.wantRecords("after the empty and invalid batches", c.Name(), 0)
}

// Concurrent batches that share messages, each listing them in another
// order: every message is processed exactly once, and no batch fails (the
// claims are taken in one order, so the batches cannot deadlock).
func testBatchConcurrentOverlapping[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	var bc batchCalls
	h := b.batchHandler(c, &bc)
	shared := msgs("shared-", 100)
	const n = 8
	batches := make([][]idem.Message, n)
	for i := range batches {
		batch := slices.Clone(shared)
		if i%2 == 1 {
			slices.Reverse(batch)
		}
		k := i % len(batch) // rotate
		batch = slices.Concat(batch[k:], batch[:k])
		batches[i] = append(batch, idem.Message{ID: fmt.Sprintf("own-%d", i), Payload: []byte("own")})
	}
	outs := make([][]idem.Outcome, n)
	errs := make([]error, n)
	race(n, func(i int) { outs[i], errs[i] = c.ProcessBatch(b.ctx, batches[i], h) })

	processed := map[string]int{}
	for i := range batches {
		if errs[i] != nil {
			t.Errorf("batch %d: err = %v, want nil", i, errs[i])
		}
		for j, o := range outs[i] {
			switch o.Status {
			case idem.Processed:
				processed[batches[i][j].ID]++
			case idem.Duplicate:
			default:
				t.Errorf("batch %d, message %q: status %v (err %v), want Processed or Duplicate", i, batches[i][j].ID, o.Status, o.Err)
			}
		}
	}
	handled := map[string]int{}
	for _, call := range bc.ids() {
		for _, id := range call {
			handled[id]++
		}
	}
	for _, id := range append(msgIDs(shared), func() []string {
		var own []string
		for i := range n {
			own = append(own, fmt.Sprintf("own-%d", i))
		}
		return own
	}()...) {
		if processed[id] != 1 || handled[id] != 1 {
			t.Errorf("message %q: Processed %d times, handled %d times, want 1 and 1", id, processed[id], handled[id])
		}
		b.wantEffects("after the concurrent batches", c.Name(), id, 1)
	}
	b.wantRecords("after the concurrent batches", c.Name(), len(shared)+n)
}

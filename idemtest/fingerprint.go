package idemtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
)

func fingerprintCases[TTx any]() []testCase[TTx] {
	return []testCase[TTx]{
		{"MismatchAfterCommit", testMismatchAfterCommit[TTx]},
		{"MismatchWhileInFlight", testMismatchWhileInFlight[TTx]},
		{"MismatchInProcessTx", testMismatchInProcessTx[TTx]},
		{"MismatchInBatch", testMismatchInBatch[TTx]},
		{"AcceptMismatchAsDuplicate", testAcceptMismatchAsDuplicate[TTx]},
		{"JSONCanonical", testJSONCanonical[TTx]},
		{"InvalidPayload", testInvalidPayload[TTx]},
		{"StoredExactly", testFingerprintStoredExactly[TTx]},
	}
}

// the same ID with another payload, after the first
// delivery committed, is a FingerprintMismatch that does not run the
// handler; the stored fingerprint is kept, so the original payload is still
// a Duplicate; and the check does not depend on anything the Consumer
// remembers (a new Consumer value, as after a restart, sees the same).
func testMismatchAfterCommit[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	var calls atomic.Int64
	h := b.handler(c, &calls)
	orig := idem.Message{ID: "pay-1", Payload: []byte(`{"amount":200}`)}
	changed := idem.Message{ID: "pay-1", Payload: []byte(`{"amount":500}`)}

	b.process("first delivery", c, orig, h, idem.Processed, nil)
	out := b.process("same ID, another payload", c, changed, h, idem.FingerprintMismatch, idem.ErrFingerprintMismatch)
	if !out.DeadLetter() || !idem.IsPermanent(out.Err) {
		t.Errorf("same ID, another payload: DeadLetter() = %v, IsPermanent = %v, want both true", out.DeadLetter(), idem.IsPermanent(out.Err))
	}
	b.process("original payload again", c, orig, h, idem.Duplicate, nil)

	// A new Consumer value with the same name, as after a restart: no local
	// state to lean on.
	again, err := idem.NewConsumer(b.s.Store, idem.Config{Name: c.Name(), PurgeInterval: -1})
	if err != nil {
		t.Fatalf("NewConsumer: %v", err)
	}
	defer again.Close()
	b.process("after a restart, another payload", again, changed, h, idem.FingerprintMismatch, idem.ErrFingerprintMismatch)
	b.process("after a restart, original payload", again, orig, h, idem.Duplicate, nil)

	// Empty and nil payloads are the same payload, and differ from others.
	empty := idem.Message{ID: "empty-1"}
	b.process("nil payload", c, empty, h, idem.Processed, nil)
	b.process("empty payload", c, idem.Message{ID: "empty-1", Payload: []byte{}}, h, idem.Duplicate, nil)
	b.process("non-empty payload for an ID first seen empty", c, idem.Message{ID: "empty-1", Payload: []byte(" ")}, h, idem.FingerprintMismatch, idem.ErrFingerprintMismatch)

	b.wantCalls("after the mismatches", &calls, 2)
	b.wantEffects("after the mismatches", c.Name(), orig.ID, 1)
	b.wantRecords("after the mismatches", c.Name(), 2)
}

// A copy with another payload arriving while the first delivery is still
// in its transaction: it waits for the first (or comes after it) and is a
// FingerprintMismatch, never a second run.
func testMismatchWhileInFlight[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	var calls atomic.Int64
	ok := b.handler(c, &calls)
	inHandler, release := make(chan struct{}), make(chan struct{})
	blocking := func(ctx context.Context, tx TTx, msg idem.Message) error {
		close(inHandler)
		<-release
		return ok(ctx, tx, msg)
	}
	orig := idem.Message{ID: "m-1", Payload: []byte("original")}
	changed := idem.Message{ID: "m-1", Payload: []byte("changed")}

	type result struct {
		out idem.Outcome
		err error
	}
	first, second, third := make(chan result, 1), make(chan result, 1), make(chan result, 1)
	go func() { o, e := c.Process(b.ctx, orig, blocking); first <- result{o, e} }()
	if !waitFor(t, inHandler, "first delivery reaching its handler") {
		close(release)
		return
	}
	go func() { o, e := c.Process(b.ctx, changed, ok); second <- result{o, e} }()
	go func() { o, e := c.Process(b.ctx, orig, ok); third <- result{o, e} }()
	close(release)
	r := <-first
	b.wantOutcome("first delivery", orig.ID, r.out, r.err, idem.Processed, nil)
	r = <-second
	b.wantOutcome("concurrent copy with another payload", changed.ID, r.out, r.err, idem.FingerprintMismatch, idem.ErrFingerprintMismatch)
	r = <-third
	b.wantOutcome("concurrent copy with the same payload", orig.ID, r.out, r.err, idem.Duplicate, nil)
	b.wantCalls("after the copies", &calls, 1)
	b.wantEffects("after the copies", c.Name(), orig.ID, 1)
	b.wantRecords("after the copies", c.Name(), 1)
}

// ProcessTx checks the fingerprint too, and a mismatch leaves the caller's
// transaction usable.
func testMismatchInProcessTx[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	var calls atomic.Int64
	h := b.handler(c, &calls)
	orig := idem.Message{ID: "m-1", Payload: []byte("original")}
	b.process("first delivery", c, orig, h, idem.Processed, nil)

	tx := b.begin()
	out, err := c.ProcessTx(b.ctx, tx, idem.Message{ID: orig.ID, Payload: []byte("changed")}, h)
	b.wantOutcome("ProcessTx, same ID with another payload", orig.ID, out, err, idem.FingerprintMismatch, idem.ErrFingerprintMismatch)
	after := b.name("written-after-the-mismatch")
	if err := b.s.WriteEffect(b.ctx, tx, after); err != nil {
		t.Errorf("WriteEffect after a mismatch in the same transaction: %v (the mismatch must not abort the transaction)", err)
	}
	if err := b.s.Store.Commit(b.ctx, tx); err != nil {
		t.Errorf("Commit after a mismatch in the same transaction: %v (the mismatch must not abort the transaction)", err)
	}
	b.wantEffectKey("effect written after the mismatch", after, 1)
	b.wantCalls("after the mismatch", &calls, 1)
	b.wantRecords("after the mismatch", c.Name(), 1)
	b.process("original payload again", c, orig, h, idem.Duplicate, nil)
}

// ProcessBatch checks the fingerprint against the store and between copies
// within the batch.
func testMismatchInBatch[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	var calls atomic.Int64
	b.process("first delivery of old", c, idem.Message{ID: "old", Payload: []byte("v1")}, b.handler(c, &calls), idem.Processed, nil)

	batch := []idem.Message{
		{ID: "old", Payload: []byte("v2")},
		{ID: "new", Payload: []byte("v1")},
		{ID: "new", Payload: []byte("v2")},
		{ID: "old", Payload: []byte("v1")},
	}
	var bc batchCalls
	outs, err := c.ProcessBatch(b.ctx, batch, b.batchHandler(c, &bc))
	if !errors.Is(err, idem.ErrFingerprintMismatch) {
		t.Errorf("batch: err = %v, want it to match ErrFingerprintMismatch", err)
	}
	want := []struct {
		s   idem.Status
		err error
	}{
		{idem.FingerprintMismatch, idem.ErrFingerprintMismatch},
		{idem.Processed, nil},
		{idem.FingerprintMismatch, idem.ErrFingerprintMismatch},
		{idem.Duplicate, nil},
	}
	for i, w := range want {
		b.wantOutcome(fmt.Sprintf("batch message %d (%s %s)", i, batch[i].ID, batch[i].Payload), batch[i].ID, outs[i], outs[i].Err, w.s, w.err)
	}
	if got := bc.ids(); len(got) != 1 || strings.Join(got[0], ",") != "new" {
		t.Errorf("batch handler calls %q, want one call with [new]", got)
	}
	b.wantEffects("after the batch", c.Name(), "new", 1)
	b.wantEffects("after the batch", c.Name(), "old", 1)
	b.wantRecords("after the batch", c.Name(), 2)
}

// The AcceptMismatchAsDuplicate policy turns a mismatch into an
// acknowledgeable Duplicate flagged MismatchAccepted, on every path.
func testAcceptMismatchAsDuplicate[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{MismatchPolicy: idem.AcceptMismatchAsDuplicate})
	var calls atomic.Int64
	h := b.handler(c, &calls)
	orig := idem.Message{ID: "m-1", Payload: []byte("original")}
	changed := idem.Message{ID: "m-1", Payload: []byte("changed")}
	b.process("first delivery", c, orig, h, idem.Processed, nil)

	out := b.process("Process, another payload", c, changed, h, idem.Duplicate, nil)
	if !out.MismatchAccepted {
		t.Errorf("Process, another payload: MismatchAccepted = false, want true")
	}
	out = b.process("Process, same payload", c, orig, h, idem.Duplicate, nil)
	if out.MismatchAccepted {
		t.Errorf("Process, same payload: MismatchAccepted = true, want false")
	}

	tx := b.begin()
	out, err := c.ProcessTx(b.ctx, tx, changed, h)
	b.wantOutcome("ProcessTx, another payload", changed.ID, out, err, idem.Duplicate, nil)
	if !out.MismatchAccepted {
		t.Errorf("ProcessTx, another payload: MismatchAccepted = false, want true")
	}
	b.commit(tx)

	batch := []idem.Message{changed, {ID: "m-2", Payload: []byte("a")}, {ID: "m-2", Payload: []byte("b")}}
	var bc batchCalls
	outs, err := c.ProcessBatch(b.ctx, batch, b.batchHandler(c, &bc))
	if err != nil {
		t.Errorf("ProcessBatch: err = %v, want nil", err)
	}
	for i, w := range []struct {
		s        idem.Status
		accepted bool
	}{{idem.Duplicate, true}, {idem.Processed, false}, {idem.Duplicate, true}} {
		b.wantOutcome(fmt.Sprintf("ProcessBatch message %d", i), batch[i].ID, outs[i], outs[i].Err, w.s, nil)
		if outs[i].MismatchAccepted != w.accepted {
			t.Errorf("ProcessBatch message %d: MismatchAccepted = %v, want %v", i, outs[i].MismatchAccepted, w.accepted)
		}
	}
	b.wantCalls("after the accepted mismatches", &calls, 1)
	b.wantEffects("after the accepted mismatches", c.Name(), orig.ID, 1)
	b.wantRecords("after the accepted mismatches", c.Name(), 2)
}

// with JSONFingerprint, reordered keys, extra
// whitespace and other spellings of one number are the same payload; a
// changed value is not.
func testJSONCanonical[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{Fingerprinter: idem.JSONFingerprint})
	var calls atomic.Int64
	h := b.handler(c, &calls)
	m := func(id, payload string) idem.Message { return idem.Message{ID: id, Payload: []byte(payload)} }

	b.process("first delivery", c, m("k", `{"a":1,"b":{"c":2,"d":3}}`), h, idem.Processed, nil)
	b.process("keys reordered at every depth", c, m("k", `{"b":{"d":3,"c":2},"a":1}`), h, idem.Duplicate, nil)
	b.process("whitespace, number spellings, trailing newline", c, m("k", " {\"b\": {\"d\": 3e0, \"c\": 2.0},\n \"a\": 10e-1}\n"), h, idem.Duplicate, nil)
	b.process("another value", c, m("k", `{"a":2,"b":{"c":2,"d":3}}`), h, idem.FingerprintMismatch, idem.ErrFingerprintMismatch)
	b.process("array order changed", c, m("arr", `[1,2]`), h, idem.Processed, nil)
	b.process("array order changed", c, m("arr", `[2,1]`), h, idem.FingerprintMismatch, idem.ErrFingerprintMismatch)
	b.process("integer above 2^53", c, m("big", `{"n":9007199254740993}`), h, idem.Processed, nil)
	b.process("neighbouring integer above 2^53", c, m("big", `{"n":9007199254740992}`), h, idem.FingerprintMismatch, idem.ErrFingerprintMismatch)
	b.process("escaped string", c, m("str", `{"s":"\u00e9"}`), h, idem.Processed, nil)
	b.process("same string unescaped", c, m("str", `{"s":"é"}`), h, idem.Duplicate, nil)
	b.wantCalls("JSON fingerprints", &calls, 4)
	b.wantRecords("JSON fingerprints", c.Name(), 4)
	b.wantEffects("JSON fingerprints", c.Name(), "k", 1)
}

// A payload the fingerprinter cannot read is Rejected with
// ErrInvalidPayload and nothing is recorded.
func testInvalidPayload[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{Fingerprinter: idem.JSONFingerprint})
	var calls atomic.Int64
	h := b.handler(c, &calls)
	for i, p := range []string{`{"a":`, `{"a":1,"a":2}`, `not json`, "", "{}{}", "\"\xff\""} {
		msg := idem.Message{ID: fmt.Sprintf("bad-%d", i), Payload: []byte(p)}
		out := b.process(fmt.Sprintf("payload %q", p), c, msg, h, idem.Rejected, idem.ErrInvalidPayload)
		if !out.DeadLetter() {
			t.Errorf("payload %q: DeadLetter() = false, want true", p)
		}
	}
	b.wantCalls("invalid payloads", &calls, 0)
	b.wantRecords("invalid payloads", c.Name(), 0)
	b.process("valid payload for a rejected ID", c, idem.Message{ID: "bad-0", Payload: []byte(`{"a":1}`)}, h, idem.Processed, nil)
}

// The store keeps the fingerprint byte for byte, 1 to 64 bytes of any
// value: no padding stripped, no truncation, no text conversion. The
// fingerprinter here returns the payload itself, so the test picks the
// exact fingerprint bytes.
func testFingerprintStoredExactly[TTx any](t *testing.T, b *bundle[TTx]) {
	identity := func(p []byte) ([]byte, error) { return bytes.Clone(p), nil }
	c := b.consumer("c", idem.Config{Fingerprinter: identity})
	var calls atomic.Int64
	h := b.handler(c, &calls)
	max := bytes.Repeat([]byte{0xff}, idem.MaxFingerprintLength)
	maxLast := append(bytes.Clone(max[:idem.MaxFingerprintLength-1]), 0xfe)
	cases := []struct {
		name        string
		stored      []byte
		same, other []byte
	}{
		{"trailing zero bytes", []byte{1, 2, 0, 0}, []byte{1, 2, 0, 0}, []byte{1, 2}},
		{"trailing spaces", []byte("ab  "), []byte("ab  "), []byte("ab")},
		{"one zero byte", []byte{0}, []byte{0}, []byte{0, 0}},
		{"not UTF-8", []byte{0xff, 0xfe, 0x80}, []byte{0xff, 0xfe, 0x80}, []byte{0xff, 0xfe, 0x81}},
		{"64 bytes, last differs", max, max, maxLast},
		{"64 bytes vs its 32-byte prefix", max, max, max[:32]},
	}
	for i, tt := range cases {
		id := fmt.Sprintf("fp-%d", i)
		b.process(tt.name+": first delivery", c, idem.Message{ID: id, Payload: tt.stored}, h, idem.Processed, nil)
		b.process(tt.name+": same fingerprint", c, idem.Message{ID: id, Payload: tt.same}, h, idem.Duplicate, nil)
		b.process(tt.name+": other fingerprint", c, idem.Message{ID: id, Payload: tt.other}, h, idem.FingerprintMismatch, idem.ErrFingerprintMismatch)
	}
	b.wantCalls("stored fingerprints", &calls, int64(len(cases)))
	b.wantRecords("stored fingerprints", c.Name(), len(cases))
}

package idemtest

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
)

func idCases[TTx any]() []testCase[TTx] {
	return []testCase[TTx]{
		{"ComparedByteForByte", testIDsByteForByte[TTx]},
		{"MaxLength", testIDsMaxLength[TTx]},
		{"Invalid", testIDsInvalid[TTx]},
		{"ConfiguredMaxLength", testIDsConfiguredMaxLength[TTx]},
	}
}

// IDs are compared byte for byte: no case folding, no trimming, no Unicode
// normalisation, no accent- or width-insensitive collation. Each pair below
// is two messages, on a consumer of its own, with the same payload (so a
// store that folds them reports a Duplicate, not a mismatch).
func testIDsByteForByte[TTx any](t *testing.T, b *bundle[TTx]) {
	pairs := []struct{ name, a, b string }{
		{"case", "Order-1", "order-1"},
		{"trailing space", "a", "a "},
		{"leading space", "b", " b"},
		{"NFC vs NFD", "\u00e9", "e\u0301"},
		{"accent", "e", "\u00e9"},
		{"sharp s", "strasse", "stra\u00dfe"},
		{"full width", "A", "\uff21"},
		{"dotless i", "i", "\u0131"},
		{"no-break space", "x y", "x\u00a0y"},
		{"LIKE wildcards", "50%", "50_"},
		{"quotes", "it's", `it"s`},
		{"backslash", `a\b`, "a/b"},
		{"4-byte UTF-8", "\U0001F600", "\U0001F601"},
		{"U+FFFD", "\ufffd", "?"},
	}
	payload := []byte("same payload")
	for i, p := range pairs {
		c := b.consumer(fmt.Sprintf("pair%d", i), idem.Config{})
		var calls atomic.Int64
		h := b.handler(c, &calls)
		for _, id := range []string{p.a, p.b} {
			b.process(fmt.Sprintf("%s: first delivery of %q", p.name, id), c, idem.Message{ID: id, Payload: payload}, h, idem.Processed, nil)
		}
		for _, id := range []string{p.a, p.b} {
			b.process(fmt.Sprintf("%s: redelivery of %q", p.name, id), c, idem.Message{ID: id, Payload: payload}, h, idem.Duplicate, nil)
			b.wantEffects(p.name, c.Name(), id, 1)
		}
		b.wantCalls(p.name, &calls, 2)
		b.wantRecords(p.name, c.Name(), 2)
	}
}

// IDs of exactly 255 bytes work, with multi-byte UTF-8, and are stored
// whole: IDs that differ only in their last byte are distinct.
func testIDsMaxLength[TTx any](t *testing.T, b *bundle[TTx]) {
	ids := []string{
		strings.Repeat("a", 255),
		strings.Repeat("a", 254) + "b",
		strings.Repeat("\u00e9", 127) + "x", // 2-byte runes
		strings.Repeat("\u00e9", 127) + "y",
		strings.Repeat("\u20ac", 85),             // 3-byte runes
		strings.Repeat("\U0001F600", 63) + "abc", // 4-byte runes
	}
	for _, id := range ids {
		if len(id) != 255 {
			panic(fmt.Sprintf("idemtest: test ID is %d bytes", len(id)))
		}
	}
	c := b.consumer("c", idem.Config{})
	var calls atomic.Int64
	h := b.handler(c, &calls)
	for i, id := range ids {
		b.process(fmt.Sprintf("255-byte ID #%d, first delivery", i), c, idem.Message{ID: id, Payload: []byte("p")}, h, idem.Processed, nil)
	}
	for i, id := range ids {
		b.process(fmt.Sprintf("255-byte ID #%d, redelivery", i), c, idem.Message{ID: id, Payload: []byte("p")}, h, idem.Duplicate, nil)
		b.wantEffects(fmt.Sprintf("255-byte ID #%d", i), c.Name(), id, 1)
	}
	b.wantCalls("255-byte IDs", &calls, int64(len(ids)))
	b.wantRecords("255-byte IDs", c.Name(), len(ids))

	// The batch path stores them whole too.
	batch := []idem.Message{
		{ID: strings.Repeat("z", 254) + "1", Payload: []byte("p")},
		{ID: strings.Repeat("z", 254) + "2", Payload: []byte("p")},
		{ID: ids[0], Payload: []byte("p")},
	}
	var bc batchCalls
	outs, err := c.ProcessBatch(b.ctx, batch, b.batchHandler(c, &bc))
	if err != nil {
		t.Errorf("batch of 255-byte IDs: err = %v, want nil", err)
	}
	for i, want := range []idem.Status{idem.Processed, idem.Processed, idem.Duplicate} {
		if outs[i].Status != want {
			t.Errorf("batch of 255-byte IDs, message %d: status %v, want %v (err %v)", i, outs[i].Status, want, outs[i].Err)
		}
	}
	b.wantRecords("after the batch of 255-byte IDs", c.Name(), len(ids)+2)
}

// invalidIDs are rejected by every path, with no side effect and no record.
var invalidIDs = []struct {
	name string
	id   string
	want error
}{
	{"empty", "", idem.ErrMissingMessageID},
	{"256 bytes", strings.Repeat("a", 256), idem.ErrInvalidMessageID},
	{"256 bytes of 2-byte runes", strings.Repeat("\u00e9", 128), idem.ErrInvalidMessageID},
	{"NUL", "a\x00b", idem.ErrInvalidMessageID},
	{"only NUL", "\x00", idem.ErrInvalidMessageID},
	{"newline", "a\nb", idem.ErrInvalidMessageID},
	{"carriage return", "a\r", idem.ErrInvalidMessageID},
	{"tab", "\ta", idem.ErrInvalidMessageID},
	{"unit separator", "a\x1f", idem.ErrInvalidMessageID},
	{"DEL", "a\x7f", idem.ErrInvalidMessageID},
	{"C1 control", "a\u0085", idem.ErrInvalidMessageID},
	{"invalid UTF-8 byte", "a\xffb", idem.ErrInvalidMessageID},
	{"lone continuation byte", "\x80", idem.ErrInvalidMessageID},
	{"overlong NUL", "\xc0\x80", idem.ErrInvalidMessageID},
	{"UTF-16 surrogate", "\xed\xa0\x80", idem.ErrInvalidMessageID},
	{"truncated rune", "a\xe2\x82", idem.ErrInvalidMessageID},
}

// Invalid IDs are Rejected by Process, ProcessTx and ProcessBatch: the
// handler is not called and nothing is recorded.
func testIDsInvalid[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	var calls atomic.Int64
	h := b.handler(c, &calls)
	for _, tt := range invalidIDs {
		msg := idem.Message{ID: tt.id, Payload: []byte("p")}
		out := b.process("Process, "+tt.name+" ID", c, msg, h, idem.Rejected, tt.want)
		if !out.DeadLetter() || !idem.IsPermanent(out.Err) {
			t.Errorf("Process, %s ID: DeadLetter() = %v, IsPermanent = %v, want both true", tt.name, out.DeadLetter(), idem.IsPermanent(out.Err))
		}
	}

	tx := b.begin()
	for _, tt := range invalidIDs {
		msg := idem.Message{ID: tt.id, Payload: []byte("p")}
		out, err := c.ProcessTx(b.ctx, tx, msg, h)
		b.wantOutcome("ProcessTx, "+tt.name+" ID", tt.id, out, err, idem.Rejected, tt.want)
	}
	b.commit(tx)

	batch := []idem.Message{{ID: "valid-1", Payload: []byte("p")}}
	for _, tt := range invalidIDs {
		batch = append(batch, idem.Message{ID: tt.id, Payload: []byte("p")})
	}
	var bc batchCalls
	outs, err := c.ProcessBatch(b.ctx, batch, b.batchHandler(c, &bc))
	if !errors.Is(err, idem.ErrMissingMessageID) || !errors.Is(err, idem.ErrInvalidMessageID) {
		t.Errorf("ProcessBatch with invalid IDs: err = %v, want it to join ErrMissingMessageID and ErrInvalidMessageID", err)
	}
	b.wantOutcome("ProcessBatch, the valid message", "valid-1", outs[0], outs[0].Err, idem.Processed, nil)
	for i, tt := range invalidIDs {
		o := outs[i+1]
		b.wantOutcome("ProcessBatch, "+tt.name+" ID", tt.id, o, o.Err, idem.Rejected, tt.want)
	}
	if got := bc.ids(); len(got) != 1 || len(got[0]) != 1 || got[0][0] != "valid-1" {
		t.Errorf("ProcessBatch with invalid IDs: handler calls %q, want one call with [valid-1]", got)
	}

	b.wantCalls("Process and ProcessTx with invalid IDs", &calls, 0)
	b.wantRecords("after the invalid IDs", c.Name(), 1)
	for _, tt := range invalidIDs {
		b.wantEffects("after the invalid IDs", c.Name(), tt.id, 0)
	}
}

// Config.MaxIDLength lowers the limit.
func testIDsConfiguredMaxLength[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{MaxIDLength: 16})
	var calls atomic.Int64
	h := b.handler(c, &calls)
	b.process("16-byte ID with MaxIDLength 16", c, idem.Message{ID: strings.Repeat("k", 16), Payload: []byte("p")}, h, idem.Processed, nil)
	b.process("17-byte ID with MaxIDLength 16", c, idem.Message{ID: strings.Repeat("k", 17), Payload: []byte("p")}, h, idem.Rejected, idem.ErrInvalidMessageID)
	b.wantCalls("MaxIDLength 16", &calls, 1)
	b.wantRecords("MaxIDLength 16", c.Name(), 1)
}

package idemtest

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

func lifecycleCases[TTx any]() []testCase[TTx] {
	return []testCase[TTx]{
		{"CloseIdempotent", testCloseIdempotent[TTx]},
		{"ProcessAfterClose", testProcessAfterClose[TTx]},
		{"CloseDuringProcess", testCloseDuringProcess[TTx]},
		{"NewConsumerValidation", testNewConsumerValidation[TTx]},
	}
}

// Close stops the purge loop, returns nil, and can be called again, also
// from several goroutines at once.
func testCloseIdempotent[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{PurgeInterval: time.Hour}) // loop running
	errs := make([]error, 4)
	race(len(errs), func(i int) { errs[i] = c.Close() })
	for i, err := range errs {
		if err != nil {
			t.Errorf("concurrent Close %d: %v, want nil", i, err)
		}
	}
	if err := c.Close(); err != nil {
		t.Errorf("Close again: %v, want nil", err)
	}
}

// After Close, Process, ProcessTx and ProcessBatch return ErrClosed, call
// no handler and record nothing.
func testProcessAfterClose[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{})
	var calls atomic.Int64
	h := b.handler(c, &calls)
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}
	out, err := c.Process(b.ctx, msg, h)
	if !errors.Is(err, idem.ErrClosed) || out.Ack() || !errors.Is(out.Err, idem.ErrClosed) {
		t.Errorf("Process after Close: status %v, err %v; want an error matching ErrClosed and no ack", out.Status, err)
	}
	tx := b.begin()
	out, err = c.ProcessTx(b.ctx, tx, msg, h)
	if !errors.Is(err, idem.ErrClosed) || out.Ack() {
		t.Errorf("ProcessTx after Close: status %v, err %v; want an error matching ErrClosed and no ack", out.Status, err)
	}
	b.commit(tx)
	outs, err := c.ProcessBatch(b.ctx, []idem.Message{msg}, b.batchHandler(c, &batchCalls{}))
	if !errors.Is(err, idem.ErrClosed) || len(outs) != 1 || outs[0].Ack() {
		t.Errorf("ProcessBatch after Close: %v, err %v; want one unacknowledged outcome and an error matching ErrClosed", outs, err)
	}
	b.wantCalls("after Close", &calls, 0)
	b.wantRecords("after Close", c.Name(), 0)
}

// Close does not wait for, nor break, a delivery in flight.
func testCloseDuringProcess[TTx any](t *testing.T, b *bundle[TTx]) {
	c := b.consumer("c", idem.Config{PurgeInterval: time.Hour})
	var calls atomic.Int64
	ok := b.handler(c, &calls)
	inHandler, release := make(chan struct{}), make(chan struct{})
	msg := idem.Message{ID: "m-1", Payload: []byte("p")}
	type result struct {
		out idem.Outcome
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := c.Process(b.ctx, msg, func(ctx context.Context, tx TTx, m idem.Message) error {
			close(inHandler)
			<-release
			return ok(ctx, tx, m)
		})
		done <- result{out, err}
	}()
	if !waitFor(t, inHandler, "delivery reaching its handler") {
		close(release)
		return
	}
	closed := make(chan struct{})
	go func() {
		_ = c.Close()
		close(closed)
	}()
	closedInTime := waitFor(t, closed, "Close with a delivery in flight")
	close(release)
	if !closedInTime {
		<-closed
	}
	r := <-done
	b.wantOutcome("delivery in flight during Close", msg.ID, r.out, r.err, idem.Processed, nil)
	b.wantEffects("after the delivery in flight", c.Name(), msg.ID, 1)
	b.wantRecords("after the delivery in flight", c.Name(), 1)
}

// NewConsumer refuses a missing or invalid name, a nil store and
// out-of-range settings.
func testNewConsumerValidation[TTx any](t *testing.T, b *bundle[TTx]) {
	for _, tt := range []struct {
		name  string
		store idemdriver.TxStore[TTx]
		cfg   idem.Config
		want  error
	}{
		{"empty name", b.s.Store, idem.Config{}, idem.ErrInvalidConsumerName},
		{"name with NUL", b.s.Store, idem.Config{Name: "a\x00b"}, idem.ErrInvalidConsumerName},
		{"name with newline", b.s.Store, idem.Config{Name: "a\n"}, idem.ErrInvalidConsumerName},
		{"256-byte name", b.s.Store, idem.Config{Name: strings.Repeat("n", 256)}, idem.ErrInvalidConsumerName},
		{"name not UTF-8", b.s.Store, idem.Config{Name: "\xff"}, idem.ErrInvalidConsumerName},
		{"nil store", nil, idem.Config{Name: "ok"}, idem.ErrInvalidConfig},
		{"MaxIDLength over 255", b.s.Store, idem.Config{Name: "ok", MaxIDLength: 256}, idem.ErrInvalidConfig},
		{"negative MaxIDLength", b.s.Store, idem.Config{Name: "ok", MaxIDLength: -1}, idem.ErrInvalidConfig},
		{"negative RetentionWindow", b.s.Store, idem.Config{Name: "ok", RetentionWindow: -time.Hour}, idem.ErrInvalidConfig},
		{"negative PurgeBatchSize", b.s.Store, idem.Config{Name: "ok", PurgeBatchSize: -1}, idem.ErrInvalidConfig},
		{"unknown MismatchPolicy", b.s.Store, idem.Config{Name: "ok", MismatchPolicy: 99}, idem.ErrInvalidConfig},
	} {
		c, err := idem.NewConsumer(tt.store, tt.cfg)
		if c != nil {
			_ = c.Close()
		}
		if c != nil || !errors.Is(err, tt.want) {
			t.Errorf("NewConsumer with %s: (%v, %v), want (nil, an error matching %v)", tt.name, c, err, tt.want)
		}
	}
	// A 255-byte name with multi-byte runes is fine.
	name := b.name("")
	for len(name) < 254 {
		name += "\u00e9"
	}
	name += strings.Repeat("x", 255-len(name))
	c, err := idem.NewConsumer(b.s.Store, idem.Config{Name: name, PurgeInterval: -1})
	if err != nil {
		t.Fatalf("NewConsumer with a 255-byte name: %v", err)
	}
	defer c.Close()
	var calls atomic.Int64
	b.process("consumer with a 255-byte name", c, idem.Message{ID: b.name("m"), Payload: []byte("p")}, b.handler(c, &calls), idem.Processed, nil)
	b.wantRecords("consumer with a 255-byte name", name, 1)
}

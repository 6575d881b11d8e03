package idemtest

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
)

func consumerCases[TTx any]() []testCase[TTx] {
	return []testCase[TTx]{
		{"TwoConsumersSameMessage", testTwoConsumersSameMessage[TTx]},
		{"ConcurrentConsumers", testConcurrentConsumers[TTx]},
	}
}

// the identity is (consumer name, message ID). Consumers of
// one event each process it once, consumer names are compared byte for
// byte too, and the fingerprint is per consumer.
func testTwoConsumersSameMessage[TTx any](t *testing.T, b *bundle[TTx]) {
	names := []string{"billing", "shipping", "Billing"}
	cs := make([]*idem.Consumer[TTx], len(names))
	calls := make([]atomic.Int64, len(names))
	msg := idem.Message{ID: "event-1", Payload: []byte("payload")}
	for i, n := range names {
		cs[i] = b.consumer(n, idem.Config{})
		b.process(fmt.Sprintf("consumer %q, first delivery", n), cs[i], msg, b.handler(cs[i], &calls[i]), idem.Processed, nil)
	}
	for i, n := range names {
		b.process(fmt.Sprintf("consumer %q, redelivery", n), cs[i], msg, b.handler(cs[i], &calls[i]), idem.Duplicate, nil)
		b.wantCalls(fmt.Sprintf("consumer %q", n), &calls[i], 1)
		b.wantEffects(fmt.Sprintf("consumer %q", n), cs[i].Name(), msg.ID, 1)
		b.wantRecords(fmt.Sprintf("consumer %q", n), cs[i].Name(), 1)
	}

	// Another consumer receiving the same ID with another payload is not a
	// mismatch: fingerprints are compared within one consumer.
	other := b.consumer("audit", idem.Config{})
	var oc atomic.Int64
	b.process("consumer \"audit\", same ID with another payload", other,
		idem.Message{ID: msg.ID, Payload: []byte("another payload")}, b.handler(other, &oc), idem.Processed, nil)
}

// Copies of one message delivered concurrently to two consumers: each
// consumer processes it exactly once.
func testConcurrentConsumers[TTx any](t *testing.T, b *bundle[TTx]) {
	a := b.consumer("a", idem.Config{})
	z := b.consumer("z", idem.Config{})
	var ca, cz atomic.Int64
	ha, hz := b.handler(a, &ca), b.handler(z, &cz)
	msg := idem.Message{ID: "event-1", Payload: []byte("payload")}
	const n = 16
	outs := make([]idem.Outcome, n)
	race(n, func(i int) {
		if i%2 == 0 {
			outs[i], _ = a.Process(b.ctx, msg, ha)
		} else {
			outs[i], _ = z.Process(b.ctx, msg, hz)
		}
	})
	var pa, pz int
	for i, o := range outs {
		switch o.Status {
		case idem.Processed:
			if i%2 == 0 {
				pa++
			} else {
				pz++
			}
		case idem.Duplicate:
		default:
			t.Errorf("copy %d: status %v (err %v), want Processed or Duplicate", i, o.Status, o.Err)
		}
	}
	if pa != 1 || pz != 1 {
		t.Errorf("Processed outcomes: consumer a %d, consumer z %d, want 1 each", pa, pz)
	}
	b.wantCalls("consumer a", &ca, 1)
	b.wantCalls("consumer z", &cz, 1)
	b.wantEffects("consumer a", a.Name(), msg.ID, 1)
	b.wantEffects("consumer z", z.Name(), msg.ID, 1)
	b.wantRecords("consumer a", a.Name(), 1)
	b.wantRecords("consumer z", z.Name(), 1)
}

package brokertest

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/idem-go/idem"
)

// Cases for faults seen in production rather than in the pattern itself: a
// broker that ignores how a message was refused, and a slow store.

// caseDeadLetterFinal: a dead letter ends the message's life on the broker.
// A broker that does not take the adapter's refusal (nats-server 2.9
// ignores "+TERM <reason>") redelivers the message after its ack deadline,
// and the adapter dead-letters it again: once the broker's duplicate window
// for dead letters has passed, a second copy appears, and so on for ever.
// The case watches for several ack deadlines and past that window.
func caseDeadLetterFinal(f *fixture) {
	good := msgs("final-good", 10)
	noID := idem.Message{Payload: []byte("final: no id")}
	poison := msgs("final-poison", 2)
	f.setHook(failPermanently(poison))
	f.publish(noID)
	f.publish(poison...)
	f.publish(good...)
	m1 := f.start(StartOptions{Concurrency: 2, Redelivery: redelivery}, nil)
	f.waitEffects(good)
	want := []expectedDL{{id: "", payload: noID.Payload, reason: idem.ReasonMissingMessageID, err: idem.ErrMissingMessageID}}
	for _, p := range poison {
		want = append(want, expectedDL{id: p.ID, payload: p.Payload, reason: idem.ReasonPermanent, err: errPoison})
	}
	f.waitFor(waitLong, func() (bool, string) {
		n := len(f.deadLetters())
		return n >= len(want), fmt.Sprintf("%d of %d dead letters", n, len(want))
	})
	// Four ack deadlines, and two past the duplicate window within which
	// the broker would drop a repeated dead letter.
	watch := max(4*redelivery, f.dedupeWindow()+2*redelivery)
	f.quiet(watch)
	f.stop(m1)
	f.t.Logf("brokertest: %d dead letters for %d bad messages after %v", len(f.deadLetters()), len(want), watch)
	f.checkDeadLetters(want)
	f.checkEffects(good)
	// Delivered once, or twice if the ack deadline ran out while the first
	// delivery was in flight (a loaded machine); a broker that ignores the
	// adapter's refusal delivers it once per ack deadline of the watch.
	bad := append([]idem.Message{noID}, poison...)
	for _, m := range bad {
		runs := f.rec.count(func(r *record) bool { return r.id == m.ID && bytes.Equal(r.payload, m.Payload) })
		switch {
		case runs > 2:
			f.t.Errorf("brokertest: dead-lettered message %q (%s) was delivered %d times in %v, want 1 (2 after an ack timeout): the broker redelivered it after the dead letter", m.ID, short(m.Payload), runs, watch)
		case runs == 2:
			f.t.Logf("brokertest: dead-lettered message %q was delivered twice (an ack timeout while the first delivery was in flight)", m.ID)
		}
	}
}

// latencyMessages is how many messages caseStoreLatency sends.
const latencyMessages = 200

// caseStoreLatency: every claim takes 20-50ms longer (a store across a
// slow network), one handler at a time, a 2s ack deadline (Redelivery:
// long enough that a loaded machine's pauses do not reach it) and the
// member may hold 128 deliveries at once: the last of a full prefetch
// waits about 4.5 seconds, twice the ack deadline, before its handler
// starts. An
// adapter that lets a buffered delivery's ack deadline run out unnoticed
// gets it redelivered (a storm: every redelivery is buffered behind the
// others too); one that fetches only what it can start in time, or keeps
// the waiting deliveries in progress, delivers each message about once.
// No member crashes and nothing is published twice, so every delivery past
// the first of a message is a redelivery the adapter caused.
func caseStoreLatency(f *fixture) {
	ms := msgs("latency", latencyMessages)
	delay := make(map[string]time.Duration, len(ms))
	for i, m := range ms {
		delay[m.ID] = time.Duration(20+(i*17)%31) * time.Millisecond // 20-50ms, 35ms on average
	}
	f.publish(ms...)
	m1 := f.start(StartOptions{Concurrency: 1, Prefetch: 128, Redelivery: 2 * redelivery},
		func(ctx context.Context, msg idem.Message, next func(context.Context, idem.Message) (idem.Outcome, error)) (idem.Outcome, error) {
			// The store's latency on the claim: the fault under test, not a
			// synchronisation.
			select {
			case <-time.After(delay[msg.ID]):
			case <-ctx.Done():
				return idem.Outcome{Status: idem.Failed, MessageID: msg.ID, Err: ctx.Err()}, ctx.Err()
			}
			return next(ctx, msg)
		})
	f.waitEffects(ms)
	f.stop(m1)
	deliveries := f.rec.count(func(*record) bool { return true })
	f.t.Logf("brokertest: %d deliveries for %d messages (%.2f per message): %s", deliveries, len(ms), float64(deliveries)/float64(len(ms)), f.rec.summary())
	if deliveries*10 > len(ms)*11 {
		f.t.Errorf("brokertest: %d deliveries for %d messages, want at most %d (1.1 per message): deliveries waiting for a handler outlived the ack deadline and were redelivered", deliveries, len(ms), len(ms)*11/10)
	}
	f.checkEffects(ms)
	f.checkNoDeadLetters()
}

package natstest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemnats"
	"github.com/nats-io/nats.go/jetstream"
)

// OutboxPublisher implements brokertest.OutboxBroker: the relay publishes
// to the work stream's subject.
func (b *natsBroker) OutboxPublisher() (idem.Publisher, string) {
	return idemnats.NewPublisher(b.js), b.streams.subject
}

// TestPublisherBatch publishes a batch with an invalid subject between two
// good messages: exactly one error per message, the bad one permanent, the
// good ones stored with the ID in Nats-Msg-Id and the headers copied; a
// re-send of the same IDs is acked and dropped by the duplicate window.
func TestPublisherBatch(t *testing.T) {
	t.Parallel()
	_, js := newJS(t, inProcess(t))
	s := newStreams(t, js, time.Minute)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	pub := idemnats.NewPublisher(js)
	msgs := []idem.Outgoing{
		{ID: "out-1", Destination: s.subject, Key: "a", Payload: []byte("one"), Headers: map[string]string{"X-Trace": "t1"}},
		{ID: "out-2", Destination: "bad subject", Payload: []byte("two")},
		{ID: "out-3", Destination: s.subject, Key: "b", Payload: []byte("three")},
	}
	for round := range 2 {
		errs := pub.Publish(ctx, msgs)
		if len(errs) != len(msgs) {
			t.Fatalf("round %d: %d errors for %d messages", round, len(errs), len(msgs))
		}
		if errs[0] != nil || errs[2] != nil {
			t.Fatalf("round %d: good messages failed: %v, %v", round, errs[0], errs[2])
		}
		if !errors.Is(errs[1], idem.ErrPermanent) {
			t.Fatalf("round %d: bad subject: %v, want idem.ErrPermanent", round, errs[1])
		}
	}
	info, err := s.stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 2 {
		t.Fatalf("stream holds %d messages, want 2 (re-send dropped)", info.State.Msgs)
	}
	m, err := s.stream.GetMsg(ctx, info.State.FirstSeq)
	if err != nil {
		t.Fatal(err)
	}
	if m.Header.Get(jetstream.MsgIDHeader) != "out-1" || m.Header.Get("X-Trace") != "t1" || string(m.Data) != "one" {
		t.Fatalf("first message: headers %v, data %q", m.Header, m.Data)
	}
}

// UndeliverableDestination implements brokertest.OutboxUndeliverable: a
// subject with a space, which NATS refuses before sending.
func (b *natsBroker) UndeliverableDestination(*testing.T) (string, bool) {
	return "bad subject", true
}

// TestPublisherNoStream: a subject no stream captures fails retryable (the
// stream may yet be created), with one error per message.
func TestPublisherNoStream(t *testing.T) {
	t.Parallel()
	_, js := newJS(t, inProcess(t))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	errs := idemnats.NewPublisher(js).Publish(ctx, []idem.Outgoing{
		{ID: "out-1", Destination: "idemnats.nostream." + unique(), Payload: []byte("one")},
	})
	if len(errs) != 1 || errs[0] == nil || errors.Is(errs[0], idem.ErrPermanent) {
		t.Fatalf("errors %v: want one retryable error", errs)
	}
}

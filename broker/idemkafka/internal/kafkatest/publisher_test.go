package kafkatest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemkafka"
)

// OutboxPublisher implements brokertest.OutboxBroker: the relay produces
// to the work topic, on a client that gives up on an unknown topic after
// two metadata loads 50ms apart (kgo's defaults wait longer than the
// relay's publish deadline, so the batch would end with ctx instead).
func (b *testBroker) OutboxPublisher() (idem.Publisher, string) {
	cl := newClient(b.t, b.seeds, kgo.MetadataMinAge(50*time.Millisecond), kgo.UnknownTopicRetries(2))
	return idemkafka.NewPublisher(cl, idemkafka.ProducerConfig{}), b.topic
}

// UndeliverableDestination implements brokertest.OutboxUndeliverable: a
// topic the cluster does not have and the client may not create (no
// kgo.AllowAutoTopicCreation), retryable: the client gives up after its
// unknown-topic retries, and the topic may yet be created.
func (b *testBroker) UndeliverableDestination(*testing.T) (string, bool) {
	return uniqueName("missing"), false
}

// TestPublisherBatch produces a batch with an oversized record between two
// good ones: one error per message, the oversized one permanent, the good
// ones acked with the ID header, the key as record key and the headers
// copied.
func TestPublisherBatch(t *testing.T) {
	t.Parallel()
	b := newTestBroker(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	pub := idemkafka.NewPublisher(b.raw, idemkafka.ProducerConfig{})
	errs := pub.Publish(ctx, []idem.Outgoing{
		{ID: "out-1", Destination: b.topic, Key: "k1", Payload: []byte("one"), Headers: map[string]string{"trace": "t1", idemkafka.DefaultIDHeader: "forged"}},
		{ID: "out-2", Destination: b.topic, Key: "k2", Payload: make([]byte, 2<<20)},
		{ID: "out-3", Destination: b.topic, Payload: []byte("three")},
	})
	if len(errs) != 3 || errs[0] != nil || errs[2] != nil || !errors.Is(errs[1], idem.ErrPermanent) {
		t.Fatalf("errors %v: want nil, permanent, nil", errs)
	}
	cl := newClient(t, b.seeds, kgo.ConsumeTopics(b.topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	got := map[string]*kgo.Record{}
	for len(got) < 2 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %d of 2 records: %v", len(got), err)
		}
		fs.EachRecord(func(r *kgo.Record) { got[header(r, idemkafka.DefaultIDHeader)] = r })
	}
	r1 := got["out-1"]
	if r1 == nil || string(r1.Key) != "k1" || header(r1, "trace") != "t1" || len(r1.Headers) != 2 || string(r1.Value) != "one" {
		t.Fatalf("out-1: %+v", r1)
	}
	if r3 := got["out-3"]; r3 == nil || r3.Key != nil {
		t.Fatalf("out-3: %+v", r3)
	}
}

// TestPublisherContextEnds: a ctx that has ended fails every message of
// the batch, retryable (the relay sends them again).
func TestPublisherContextEnds(t *testing.T) {
	t.Parallel()
	b := newTestBroker(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	errs := idemkafka.NewPublisher(b.raw, idemkafka.ProducerConfig{}).Publish(ctx, []idem.Outgoing{
		{ID: "out-1", Destination: b.topic, Payload: []byte("one")},
		{ID: "out-2", Destination: b.topic, Payload: []byte("two")},
	})
	if len(errs) != 2 {
		t.Fatalf("%d errors for 2 messages", len(errs))
	}
	for i, err := range errs {
		if err == nil || errors.Is(err, idem.ErrPermanent) {
			t.Errorf("message %d: %v, want a retryable error", i, err)
		}
	}
}

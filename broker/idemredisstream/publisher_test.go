package idemredisstream_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemredisstream"
)

// OutboxPublisher implements brokertest.OutboxBroker: the relay appends to
// the work stream.
func (b *streamBroker) OutboxPublisher() (idem.Publisher, string) {
	return idemredisstream.NewPublisher(b.rdb, idemredisstream.ProducerConfig{}), b.stream
}

// TestPublisherBatch publishes a batch with an invalid ID between two good
// messages in one pipeline: one error per message, the bad one permanent,
// the good ones appended with the message-id field and headers as fields.
func TestPublisherBatch(t *testing.T) {
	t.Parallel()
	testURL(t)
	rdb := client(t)
	stream, _ := keys(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	pub := idemredisstream.NewPublisher(rdb, idemredisstream.ProducerConfig{})
	errs := pub.Publish(ctx, []idem.Outgoing{
		{ID: "out-1", Destination: stream, Payload: []byte("one"), Headers: map[string]string{"trace": "t1", idemredisstream.DefaultIDField: "forged"}},
		{ID: "bad\x00id", Destination: stream, Payload: []byte("two")},
		{ID: "out-3", Destination: stream, Payload: []byte("three")},
	})
	if len(errs) != 3 || errs[0] != nil || errs[2] != nil || !errors.Is(errs[1], idem.ErrPermanent) {
		t.Fatalf("errors %v: want nil, permanent, nil", errs)
	}
	entries, err := rdb.XRange(ctx, stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 {
		t.Fatalf("%d entries, want 2", len(entries))
	}
	v := entries[0].Values
	if v[idemredisstream.DefaultIDField] != "out-1" || v["trace"] != "t1" || v[idemredisstream.DefaultPayloadField] != "one" {
		t.Fatalf("first entry %v", v)
	}
	if entries[1].Values[idemredisstream.DefaultIDField] != "out-3" {
		t.Fatalf("second entry %v", entries[1].Values)
	}
}

// UndeliverableDestination implements brokertest.OutboxUndeliverable: a
// string key, on which XADD fails with WRONGTYPE (retryable: the key may
// be deleted).
func (b *streamBroker) UndeliverableDestination(t *testing.T) (string, bool) {
	key := b.stream + ".string"
	if err := b.rdb.Set(t.Context(), key, "not a stream", 0).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.rdb.Del(context.Background(), key) })
	return key, false
}

package idemkafka

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
)

// NewPublisher returns the outbox relay's idem.Publisher for Kafka: each
// outgoing message is produced to the topic in its Destination, with its
// ID in cfg.IDHeader (DefaultIDHeader, "message-id", where the consumer
// adapter reads it), its Key as the record key (no key when empty, so the
// client's partitioner keeps one key's records in one partition, in
// order), and its Headers as record headers (sorted by name, never a
// second ID header).
//
// A batch is produced asynchronously, its partitions are flushed at once
// rather than after the client's ProducerLinger (kgo.Client.ProduceSync),
// and every ack is awaited (the client's acks setting: all in-sync
// replicas by default); a message counts as sent only on its ack. Batches
// of relay rounds in flight at once (RelayConfig.Workers) are produced
// side by side; with the client's default idempotent producer, records of
// one partition keep their order across retries. An ID idem would reject, an invalid
// topic name, or a record over the broker's or client's size limit comes
// back wrapped with idem.Permanent; every other error (an unknown topic,
// a timeout, ctx ending, a Producer configuration error) is retryable.
// The publisher is safe for concurrent use; cl stays the caller's.
func NewPublisher(cl *kgo.Client, cfg ProducerConfig) idem.Publisher {
	return kafkaPublisher{p: NewProducer(cl, cfg)}
}

type kafkaPublisher struct{ p *Producer }

// Publish implements idem.Publisher.
func (k kafkaPublisher) Publish(ctx context.Context, msgs []idem.Outgoing) []error {
	errs := make([]error, len(msgs))
	if err := k.p.check(); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	recs := make([]*kgo.Record, 0, len(msgs))
	index := make(map[*kgo.Record]int, len(msgs))
	for i, m := range msgs {
		var key []byte
		if m.Key != "" {
			key = []byte(m.Key)
		}
		names := make([]string, 0, len(m.Headers))
		for n := range m.Headers {
			names = append(names, n)
		}
		slices.Sort(names)
		headers := make([]kgo.RecordHeader, len(names))
		for j, n := range names {
			headers[j] = kgo.RecordHeader{Key: n, Value: []byte(m.Headers[n])}
		}
		rec, err := k.p.record(m.Destination, m.ID, key, m.Payload, headers)
		if err != nil {
			errs[i] = idem.Permanent(fmt.Errorf("idemkafka: publish to %q: %w", m.Destination, err))
			continue
		}
		recs = append(recs, rec)
		index[rec] = i
	}
	if len(recs) == 0 {
		return errs
	}
	// ProduceSync produces asynchronously, then stops the linger of the
	// partitions it produced to (the client's ProducerLinger, 10ms by
	// default, would otherwise hold every batch that long) and waits for
	// every promise. It runs aside so that ctx bounds the wait.
	done := make(chan kgo.ProduceResults, 1)
	go func() { done <- k.p.cl.ProduceSync(ctx, recs...) }()
	select {
	case results := <-done:
		for _, r := range results {
			i := index[r.Record]
			if r.Err == nil {
				continue
			}
			err := fmt.Errorf("idemkafka: publish %q to %q: %w", msgs[i].ID, msgs[i].Destination, r.Err)
			if errors.Is(err, kerr.InvalidTopicException) || errors.Is(err, kerr.MessageTooLarge) ||
				errors.Is(err, kerr.RecordListTooLarge) || errors.Is(err, kerr.InvalidRecord) {
				err = idem.Permanent(err)
			}
			errs[i] = err
		}
	case <-ctx.Done():
		// Records whose acks have not all come when ctx ends fail
		// (retryable): the relay sends them again, which the consumers
		// deduplicate.
		for _, i := range index {
			errs[i] = fmt.Errorf("idemkafka: publish %q to %q: no ack: %w", msgs[i].ID, msgs[i].Destination, ctx.Err())
		}
	}
	return errs
}

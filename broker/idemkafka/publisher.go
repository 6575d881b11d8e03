package idemkafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

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
// A batch is produced asynchronously and then every ack is awaited (the
// client's acks setting: all in-sync replicas by default); a message
// counts as sent only on its ack. An ID idem would reject, an invalid
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
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex // guards errs, pending and closed against late promises
		pending = make([]bool, len(msgs))
		closed  bool
	)
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
		wg.Add(1)
		pending[i] = true
		k.p.cl.Produce(ctx, rec, func(_ *kgo.Record, err error) {
			defer wg.Done()
			if err != nil {
				err = fmt.Errorf("idemkafka: publish %q to %q: %w", m.ID, m.Destination, err)
				if errors.Is(err, kerr.InvalidTopicException) || errors.Is(err, kerr.MessageTooLarge) ||
					errors.Is(err, kerr.RecordListTooLarge) || errors.Is(err, kerr.InvalidRecord) {
					err = idem.Permanent(err)
				}
			}
			mu.Lock()
			if !closed {
				errs[i], pending[i] = err, false
			}
			mu.Unlock()
		})
	}
	acked := make(chan struct{})
	go func() { wg.Wait(); close(acked) }()
	select {
	case <-acked:
	case <-ctx.Done():
	}
	// Records still unacked when ctx ends fail (retryable): the relay
	// sends them again, which the consumers deduplicate.
	mu.Lock()
	defer mu.Unlock()
	closed = true
	for i, p := range pending {
		if p {
			errs[i] = fmt.Errorf("idemkafka: publish %q to %q: no ack: %w", msgs[i].ID, msgs[i].Destination, ctx.Err())
		}
	}
	return slices.Clone(errs)
}

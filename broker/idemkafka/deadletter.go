package idemkafka

import (
	"context"
	"fmt"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
)

// messageID reads the message ID from the record's IDHeader. A missing
// header (or an empty value) gives "", which the Idempotent Consumer
// rejects with idem.ErrMissingMessageID. A header repeated with different
// values is ambiguous: the error matches idem.ErrInvalidMessageID and the
// record is dead-lettered without calling the Processor.
func (c *Consumer) messageID(r *kgo.Record) (string, error) {
	return headerID(r, c.cfg.IDHeader)
}

func headerID(r *kgo.Record, key string) (string, error) {
	var id string
	found := false
	for _, h := range r.Headers {
		if h.Key != key {
			continue
		}
		if found && string(h.Value) != id {
			return "", fmt.Errorf("%w: header %q appears more than once with different values", idem.ErrInvalidMessageID, key)
		}
		id, found = string(h.Value), true
	}
	return id, nil
}

// deadLetter produces r to the dead-letter topic, synchronously: its key,
// value and headers as they were, plus the reason headers. The original
// record counts as done only when this returns nil.
func (c *Consumer) deadLetter(ctx context.Context, r *kgo.Record, st idem.Settlement) error {
	add := st.DeadLetterHeaders()
	headers := make([]kgo.RecordHeader, 0, len(r.Headers)+len(add)+3)
	headers = append(headers, r.Headers...)
	for _, k := range []string{idem.HeaderDeadLetterReason, idem.HeaderDeadLetterError, idem.HeaderDeadLetterStatus, idem.HeaderOriginalMessageID} {
		if v, ok := add[k]; ok {
			headers = append(headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
	}
	headers = append(headers,
		kgo.RecordHeader{Key: HeaderOriginalTopic, Value: []byte(r.Topic)},
		kgo.RecordHeader{Key: HeaderOriginalPartition, Value: []byte(strconv.FormatInt(int64(r.Partition), 10))},
		kgo.RecordHeader{Key: HeaderOriginalOffset, Value: []byte(strconv.FormatInt(r.Offset, 10))},
	)
	dl := &kgo.Record{Topic: c.cfg.DeadLetter, Key: r.Key, Value: r.Value, Headers: headers}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.CommitTimeout)
	defer cancel()
	if err := c.cl.ProduceSync(ctx, dl).FirstErr(); err != nil {
		return fmt.Errorf("idemkafka: produce to dead letter %q: %w", c.cfg.DeadLetter, err)
	}
	return nil
}

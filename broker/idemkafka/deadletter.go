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
func (c *Consumer) deadLetter(ctx context.Context, r *kgo.Record, out idem.Outcome) error {
	reason := out.Status.String()
	if out.Err != nil && out.Err.Error() != "" {
		reason = out.Err.Error()
	}
	headers := make([]kgo.RecordHeader, 0, len(r.Headers)+5)
	headers = append(headers, r.Headers...)
	headers = append(headers,
		kgo.RecordHeader{Key: HeaderDeadLetterReason, Value: []byte(reason)},
		kgo.RecordHeader{Key: HeaderDeadLetterStatus, Value: []byte(out.Status.String())},
		kgo.RecordHeader{Key: HeaderDeadLetterTopic, Value: []byte(r.Topic)},
		kgo.RecordHeader{Key: HeaderDeadLetterPartition, Value: []byte(strconv.FormatInt(int64(r.Partition), 10))},
		kgo.RecordHeader{Key: HeaderDeadLetterOffset, Value: []byte(strconv.FormatInt(r.Offset, 10))},
	)
	dl := &kgo.Record{Topic: c.cfg.DeadLetter, Key: r.Key, Value: r.Value, Headers: headers}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.CommitTimeout)
	defer cancel()
	if err := c.cl.ProduceSync(ctx, dl).FirstErr(); err != nil {
		return fmt.Errorf("idemkafka: produce to dead letter %q: %w", c.cfg.DeadLetter, err)
	}
	return nil
}

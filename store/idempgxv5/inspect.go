package idempgxv5

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/jackc/pgx/v5"
)

// ErrNotFound is returned (wrapped) by [Store.Inspect] when no record
// exists for the consumer and message ID.
var ErrNotFound = errors.New("idempgxv5: record not found")

// Record is one processed-message record, as [Store.Inspect] reads it.
type Record struct {
	// Consumer is the consumer name.
	Consumer string
	// MessageID is the message ID.
	MessageID string
	// Fingerprint is the payload fingerprint stored with the claim (32
	// bytes of SHA-256 with idem's fingerprinters).
	Fingerprint []byte
	// ProcessedAt is when the claiming transaction began, by the
	// database server's clock (now()).
	ProcessedAt time.Time
}

// ConsumerStats summarises one consumer's records, as [Store.Stats] reads
// them.
type ConsumerStats struct {
	// Consumer is the consumer name.
	Consumer string
	// Records is the number of processed-message records kept.
	Records int64
	// Oldest and Newest are the earliest and latest ProcessedAt, by the
	// database server's clock. Newest minus the retention window is the
	// purge horizon.
	Oldest, Newest time.Time
}

// Inspect returns the record of (consumer, messageID). It returns an error
// matching [ErrNotFound] when there is none, and one matching
// idem.ErrInvalidConsumerName or idem.ErrInvalidMessageID for names that
// no record can have. IDs are compared byte for byte.
func (s *Store) Inspect(ctx context.Context, consumer, messageID string) (Record, error) {
	if err := idem.ValidateConsumerName(consumer); err != nil {
		return Record{}, err
	}
	if err := idem.ValidateMessageID(messageID, 0); err != nil {
		return Record{}, err
	}
	var r Record
	err := s.pool.QueryRow(ctx, s.q.inspect, consumer, messageID).Scan(&r.Consumer, &r.MessageID, &r.Fingerprint, &r.ProcessedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Record{}, fmt.Errorf("%w: consumer %q, message ID %q in %s", ErrNotFound, consumer, messageID, s.table.Qualified)
	}
	if err != nil {
		return Record{}, err
	}
	return r, nil
}

// Stats returns one entry per consumer with records in the table, ordered
// by consumer name (byte order). It scans the whole table (one GROUP BY),
// so it is an operator's tool, not something to call per message.
func (s *Store) Stats(ctx context.Context) ([]ConsumerStats, error) {
	rows, err := s.pool.Query(ctx, s.q.stats)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (ConsumerStats, error) {
		var c ConsumerStats
		err := row.Scan(&c.Consumer, &c.Records, &c.Oldest, &c.Newest)
		return c, err
	})
}

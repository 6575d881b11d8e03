package idempgxv5

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
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
	// ProcessedAt is when the record was written, by the database
	// server's clock (now(): the claiming transaction's start), in UTC.
	// Lease mode stamps it again when an attempt takes the record over,
	// completes it or releases it.
	ProcessedAt time.Time
	// State is the record's state: completed for every record written in
	// transactional mode; in_progress or failed only in lease mode.
	State idemdriver.RecordState
	// Token is the fencing token of the attempt owning an in_progress
	// record (lease mode; 0 for transactional records). After a release
	// it is one more than the released attempt's.
	Token int64
	// Attempt is the number of attempts made (lease mode; 1 otherwise).
	Attempt int
	// LeaseExpiresAt is when the lease of the last attempt ends or ended,
	// by the server's clock, in UTC; zero for transactional records.
	LeaseExpiresAt time.Time
	// Error is the last error a lease-mode attempt released the record
	// with.
	Error string
}

// ConsumerStats summarises one consumer's records, as [Store.Stats] reads
// them.
type ConsumerStats struct {
	// Consumer is the consumer name.
	Consumer string
	// Count is the number of processed-message records kept, in every
	// state.
	Count int64
	// Oldest and Newest are the earliest and latest ProcessedAt, in UTC, by
	// the database server's clock. Newest minus the retention window is the
	// purge horizon.
	Oldest, Newest time.Time
}

// Inspect returns the committed record of (consumer, messageID), in
// either mode. It returns an error
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
	var (
		r         Record
		state     int16
		leaseEnd  pgtype.Timestamptz
		lastError pgtype.Text
	)
	err := s.pool.QueryRow(ctx, s.q.inspect, consumer, messageID).
		Scan(&r.Consumer, &r.MessageID, &r.Fingerprint, &r.ProcessedAt, &state, &r.Token, &r.Attempt, &leaseEnd, &lastError)
	if errors.Is(err, pgx.ErrNoRows) {
		return Record{}, fmt.Errorf("%w: consumer %q, message ID %q in %s", ErrNotFound, consumer, messageID, s.table.Qualified)
	}
	if err != nil {
		return Record{}, err
	}
	r.ProcessedAt = r.ProcessedAt.UTC()
	r.State = idemdriver.RecordState(state)
	if leaseEnd.Valid {
		r.LeaseExpiresAt = leaseEnd.Time.UTC()
	}
	r.Error = lastError.String
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
		err := row.Scan(&c.Consumer, &c.Count, &c.Oldest, &c.Newest)
		c.Oldest, c.Newest = c.Oldest.UTC(), c.Newest.UTC()
		return c, err
	})
}

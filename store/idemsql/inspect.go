package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// ErrNotFound is returned (wrapped) by [Store.Inspect] when no record
// exists for the consumer and message ID.
var ErrNotFound = errors.New("idemsql: record not found")

// Record is one processed-message record, as [Store.Inspect] reads it.
type Record struct {
	// Consumer is the consumer name.
	Consumer string
	// MessageID is the message ID.
	MessageID string
	// Fingerprint is the payload fingerprint stored with the claim (32
	// bytes of SHA-256 with idem's fingerprinters).
	Fingerprint []byte
	// ProcessedAt is when the record was written, by the database server's
	// clock, in UTC: the claiming transaction's start on PostgreSQL (now()),
	// the claim statement's time on MySQL (UTC_TIMESTAMP(6)) and on SQLite
	// (millisecond precision). Lease mode stamps it again when an attempt
	// takes the record over, completes it or releases it.
	ProcessedAt time.Time
	// State is the record's state: completed for every record written in
	// transactional mode; in_progress or failed only in lease mode.
	State idemdriver.RecordState
	// Token is the fencing token of the attempt owning an in_progress
	// record (lease mode; 0 for transactional records).
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
	// Count is the number of processed-message records kept.
	Count int64
	// Oldest and Newest are the earliest and latest ProcessedAt, in UTC, by
	// the database server's clock. Newest minus the retention window is the
	// purge horizon.
	Oldest, Newest time.Time
}

// Inspect returns the committed record of (consumer, messageID), compared
// byte for byte, in either mode. It returns an error matching [ErrNotFound] when there is
// none, one matching idem.ErrInvalidConsumerName or idem.ErrInvalidMessageID
// for names that no record can have, and the driver's error otherwise.
func (s *Store) Inspect(ctx context.Context, consumer, messageID string) (Record, error) {
	if err := idem.ValidateConsumerName(consumer); err != nil {
		return Record{}, err
	}
	if err := idem.ValidateMessageID(messageID, 0); err != nil {
		return Record{}, err
	}
	r := Record{Consumer: consumer, MessageID: messageID}
	var (
		at, state int64
		leaseEnd  sql.NullInt64
		lastError sql.NullString
	)
	err := s.db.QueryRowContext(ctx, s.q.inspect, consumer, messageID).
		Scan(&r.Fingerprint, &at, &state, &r.Token, &r.Attempt, &leaseEnd, &lastError)
	if errors.Is(err, sql.ErrNoRows) {
		return Record{}, fmt.Errorf("%w: consumer %q, message ID %q in %s", ErrNotFound, consumer, messageID, s.table.Qualified)
	}
	if err != nil {
		return Record{}, fmt.Errorf("idemsql: inspect: %w", err)
	}
	r.ProcessedAt = time.UnixMicro(at).UTC()
	r.State = idemdriver.RecordState(state)
	if leaseEnd.Valid {
		r.LeaseExpiresAt = time.UnixMicro(leaseEnd.Int64).UTC()
	}
	r.Error = lastError.String
	return r, nil
}

// Stats returns one entry per consumer with records in the table, ordered
// by consumer name (byte order). It reads the whole table (one GROUP BY
// over the (consumer, processed_at) index), so it is an operator's tool,
// not something to call per message.
func (s *Store) Stats(ctx context.Context) ([]ConsumerStats, error) {
	rows, err := s.db.QueryContext(ctx, s.q.stats)
	if err != nil {
		return nil, fmt.Errorf("idemsql: stats: %w", err)
	}
	defer rows.Close()
	var out []ConsumerStats
	for rows.Next() {
		var (
			c              ConsumerStats
			oldest, newest int64
		)
		if err := rows.Scan(&c.Consumer, &c.Count, &oldest, &newest); err != nil {
			return nil, fmt.Errorf("idemsql: stats: %w", err)
		}
		c.Oldest, c.Newest = time.UnixMicro(oldest).UTC(), time.UnixMicro(newest).UTC()
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("idemsql: stats: %w", err)
	}
	return out, nil
}

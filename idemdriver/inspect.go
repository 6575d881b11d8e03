package idemdriver

import (
	"context"
	"errors"
	"time"
)

// ErrNotFound means an inspected record does not exist.
var ErrNotFound = errors.New("idem: record not found")

// Inspector is an optional capability of a store: read one record and
// per-consumer statistics, for operators (the idem command's inspect and
// stats). It changes nothing.
type Inspector interface {
	// Inspect returns the record of (consumer, message ID), or an error
	// matching ErrNotFound. Invalid names are refused (ValidateKey).
	Inspect(ctx context.Context, consumer, messageID string) (Record, error)
	// Stats returns one entry per consumer with records, by name.
	Stats(ctx context.Context) ([]ConsumerStats, error)
}

// Record is a processed-messages record as a store keeps it.
type Record struct {
	Consumer  string
	MessageID string
	// Fingerprint is the payload fingerprint.
	Fingerprint []byte
	// ProcessedAt is when the record was written or last updated, by the
	// store's clock.
	ProcessedAt time.Time
	// State is the record's state; transactional records are completed.
	State RecordState
	// Token and Attempt are the lease-mode fencing token and attempt
	// number (zero for transactional records).
	Token   int64
	Attempt int
	// LeaseExpiresAt is when an in_progress record's lease ends (zero
	// otherwise).
	LeaseExpiresAt time.Time
	// Error is a failed or released attempt's error text.
	Error string
	// Result and ContentType are a completed lease-mode record's stored
	// result (LeaseStore.Complete), byte for byte: what a redelivery is
	// settled with. Inspect fills them in; nil and "" for a record in
	// progress or failed, and for a transactional record. Lists
	// (Operator.ListRecords) may leave them out.
	Result      []byte
	ContentType string
}

// ConsumerStats summarises one consumer's records.
type ConsumerStats struct {
	Consumer string
	// Count is the number of records, in every state.
	Count int64
	// Oldest and Newest are the earliest and latest ProcessedAt.
	Oldest, Newest time.Time
}

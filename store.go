package idem

import (
	"context"
	"time"
)

// TxStore records processed messages inside database transactions of type
// TTx: pgx.Tx for PostgreSQL on pgx, *sql.Tx for the database/sql dialects,
// *MemoryTx for the in-memory store. It is the seam between the [Consumer]
// and a database, and the interface third-party stores implement; every
// implementation must pass the idemtest conformance suite.
//
// The processed-messages table holds one row per (consumer, message ID)
// under a unique key, with the payload fingerprint and the time the row was
// written, taken from the database server's clock.
//
// Contract, for implementers:
//   - ClaimTx inserts the row inside tx. If a row with the same key exists,
//     or is being inserted by a concurrent transaction, ClaimTx waits for that
//     transaction to end (as a unique index does) and reports Claimed=false
//     with the stored fingerprint if it committed, or claims the row if it
//     rolled back. A duplicate must never abort tx: on PostgreSQL that means
//     ON CONFLICT DO NOTHING, never catching SQLSTATE 23505. Duplicates are
//     detected by rows affected or error codes, never by error text.
//   - When Claimed is false, the result carries the stored record's state
//     (ClaimResult.State) read with its fingerprint, in the same statement:
//     a lease-mode record of the same consumer name may be in progress or
//     failed, and the Consumer settles it as InProgress or poison instead
//     of Duplicate. Transactional records are StateCompleted (or zero).
//   - ClaimBatchTx does the same for many messages with one statement. IDs
//     in one call are distinct; results come back in the order given. The
//     Consumer passes them sorted by message ID (byte order), so that two
//     concurrent batches sharing IDs take their locks in the same order and
//     cannot deadlock: insert the rows in the order given.
//   - Errors other than a duplicate are returned as they are; the Consumer
//     wraps them with [ErrStore].
//   - Methods are safe for concurrent use; a TTx is used by one goroutine.
type TxStore[TTx any] interface {
	// Begin starts a transaction for claims and side effects.
	Begin(ctx context.Context) (TTx, error)
	// ClaimTx claims one message inside tx; see the contract above.
	ClaimTx(ctx context.Context, tx TTx, p *ClaimParams) (ClaimResult, error)
	// ClaimBatchTx claims len(p.Messages) messages inside tx with one
	// statement; the result has one entry per message, in order.
	ClaimBatchTx(ctx context.Context, tx TTx, p *ClaimBatchParams) ([]ClaimResult, error)
	// Commit commits tx. An error means the claims did not commit (or that
	// the outcome is unknown, as after a lost connection).
	Commit(ctx context.Context, tx TTx) error
	// Rollback rolls tx back. It must be safe to call after a failed Commit.
	Rollback(ctx context.Context, tx TTx) error
	// Purge deletes processed records outside the retention window in
	// bounded batches; see [PurgeParams].
	Purge(ctx context.Context, p *PurgeParams) (PurgeResult, error)
}

// BeginClaimer is an optional capability of a TxStore: begin a transaction
// and claim the first message in one round trip to the database (pipelined
// with BEGIN), so the claim costs no network round trip of its own. The
// Consumer uses it when the store has it. The result and errors are those
// of Begin followed by ClaimTx; on error no transaction is left open.
type BeginClaimer[TTx any] interface {
	BeginClaim(ctx context.Context, p *ClaimParams) (TTx, ClaimResult, error)
}

// Migrator is an optional capability of a store: create or upgrade its
// tables from the migrations embedded in the store's package. It is
// idempotent and safe to run from several processes at once.
type Migrator interface {
	Migrate(ctx context.Context) error
}

// ClaimParams names one message to claim.
type ClaimParams struct {
	// Consumer is the consumer name, already validated.
	Consumer string
	// MessageID is the message ID, already validated.
	MessageID string
	// Fingerprint is the payload fingerprint, 1 to MaxFingerprintLength bytes.
	Fingerprint []byte
}

// ClaimBatchParams names the messages of one batch claim.
type ClaimBatchParams struct {
	// Consumer is the consumer name, already validated.
	Consumer string
	// Messages are the messages to claim, with distinct IDs.
	Messages []ClaimMessage
}

// ClaimMessage is one message of a batch claim.
type ClaimMessage struct {
	// MessageID is the message ID, already validated.
	MessageID string
	// Fingerprint is the payload fingerprint.
	Fingerprint []byte
}

// ClaimResult is the result of claiming one message.
type ClaimResult struct {
	// Claimed is true when this transaction inserted the record: the message
	// is new and the handler runs. False means a committed record exists.
	Claimed bool
	// Fingerprint is the stored fingerprint when Claimed is false.
	Fingerprint []byte
	// State is the existing record's state when Claimed is false: a record
	// written by a [LeaseConsumer] under the same consumer name may be
	// StateInProgress or StateFailed, which the Consumer must not
	// acknowledge as a duplicate. Zero is treated as StateCompleted, for
	// stores that predate this field.
	State RecordState
}

// PurgeParams controls one purge of a consumer's processed records.
//
// Purging is downtime-safe: the horizon is the time of the consumer's newest
// record minus the retention window, not the current time minus the window.
// A consumer that was down for longer than the window keeps the history it
// needs when it comes back and receives the redeliveries of that downtime.
type PurgeParams struct {
	// Consumer is the consumer whose records are purged.
	Consumer string
	// RetentionWindow is how long records are kept, measured back from the
	// consumer's newest record. Must be positive.
	RetentionWindow time.Duration
	// BatchSize is the most rows one DELETE removes, each batch in its own
	// short transaction so the inbox keeps flowing. Must be positive.
	BatchSize int
	// DryRun counts the rows that would be deleted and deletes nothing.
	DryRun bool
	// OnBatch, if set, is called after each batch with the rows deleted so
	// far; it must be fast.
	OnBatch func(deletedSoFar int64)
}

// PurgeResult reports one purge.
type PurgeResult struct {
	// Deleted is the number of records deleted (or, with DryRun, that would be).
	Deleted int64
	// Batches is the number of DELETE statements run.
	Batches int
	// Horizon is the cut-off: records written before it were deleted. Zero
	// when the consumer has no records.
	Horizon time.Time
}

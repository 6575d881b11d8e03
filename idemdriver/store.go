package idemdriver

import (
	"context"
	"time"
)

// TxStore records processed messages inside database transactions of type
// TTx: pgx.Tx for PostgreSQL on pgx, *sql.Tx for the database/sql
// dialects, *idem.MemoryTx for the in-memory store. It is what transactional
// mode (idem.Consumer) runs on: the claim is the first statement of the
// handler's own transaction, so the record and the side effects commit or
// roll back together, as the Idempotent Consumer pattern requires.
//
// The processed-messages table holds one row per (consumer, message ID)
// under a unique key, with the payload fingerprint, the record's state and
// the time it was written, by the store's clock.
//
// Contract:
//   - ClaimTx inserts the row inside tx. If a row with the same key exists,
//     or is being inserted by a concurrent transaction, ClaimTx waits for
//     that transaction to end (as a unique index does) and reports
//     Claimed=false with the stored fingerprint and state if it committed,
//     or claims the row if it rolled back. A duplicate never aborts tx: on
//     PostgreSQL that means ON CONFLICT DO NOTHING, never catching SQLSTATE
//     23505. Duplicates are detected by rows affected or error codes, never
//     by error text.
//   - Invalid parameters are refused before any statement runs (see
//     [ValidateClaimParams]), so tx stays usable.
//   - Errors other than a duplicate or invalid input are returned as they
//     are; the core wraps them with idem.ErrStore.
//   - Methods are safe for concurrent use; a TTx is used by one goroutine.
//   - Nothing derived from the contexts of a transaction's calls (Begin's,
//     ClaimTx's, Commit's, Rollback's) is kept once Commit or Rollback has
//     returned, as database/sql cancels its transaction's context in both:
//     the core reuses those contexts for its next transactions.
type TxStore[TTx any] interface {
	Retainer
	// Begin starts a transaction for claims and side effects.
	Begin(ctx context.Context) (TTx, error)
	// ClaimTx claims one message inside tx; see the contract above.
	ClaimTx(ctx context.Context, tx TTx, p *ClaimParams) (ClaimResult, error)
	// Commit commits tx. An error means the claims did not commit, or that
	// the outcome is unknown (as after a lost connection).
	Commit(ctx context.Context, tx TTx) error
	// Rollback rolls tx back. It is safe to call after a failed Commit.
	Rollback(ctx context.Context, tx TTx) error
}

// BatchClaimer is an optional capability of a TxStore: claim many messages
// with one statement (a multi-row insert with RETURNING, or the dialect's
// equivalent), the throughput path of batch consumers. Without it the core
// calls ClaimTx once per message, in the same order.
//
// IDs in one call are distinct and come sorted by message ID (byte order),
// so that two concurrent batches sharing IDs take their locks in the same
// order and cannot deadlock: insert the rows in the order given. The result
// has one entry per message, in order. Invalid parameters are refused
// before any statement runs ([ValidateClaimBatchParams]).
type BatchClaimer[TTx any] interface {
	ClaimBatchTx(ctx context.Context, tx TTx, p *ClaimBatchParams) ([]ClaimResult, error)
}

// BeginClaimer is an optional capability of a TxStore: begin a transaction
// and claim the first message in one round trip (the claim pipelined with
// BEGIN), so the claim costs no network round trip of its own. The result
// and errors are those of Begin followed by ClaimTx; on error no
// transaction is left open.
//
// Since the claim is the transaction's first statement, a claim that
// finds a committed record (Claimed false) may end the transaction
// itself, sending the read of the record and ROLLBACK together, so that a
// duplicate costs one round trip after the claim instead of two: it then
// reports ClaimResult.Ended, returns the zero TTx, and the caller neither
// commits nor rolls back (nothing is left open; the transaction held
// nothing but the claim, which wrote nothing). When the conflicting
// record vanished before it could be read (a purge deleted it), such a
// store begins again and claims once more. A store may as well leave the
// transaction open (Ended false), for the caller to roll back.
type BeginClaimer[TTx any] interface {
	BeginClaim(ctx context.Context, p *ClaimParams) (TTx, ClaimResult, error)
}

// CallTimer is an optional capability of a BeginClaimer: it bounds the
// store calls of the transactions its BeginClaim begins by itself, with
// no context of the caller's that can be cancelled (pgx, for one, watches
// such a context on every network call, at a few allocations each).
//
// When TimesCalls reports true and ClaimParams.CallTimeout is positive,
// BeginClaim (acquiring a connection included), and then Commit,
// Rollback, and the outbox's EmitTx and EmitCommit of the transaction it
// returned, each end within CallTimeout of their start with an error
// matching ErrStoreTimeout (a stalled connection is then given up), while
// the handler's own statements in between are not bounded. ctx still
// cancels them. The core then passes the caller's context as it is,
// instead of a context of its own per transaction.
type CallTimer interface {
	TimesCalls() bool
}

// BeginBatchClaimer is an optional capability of a BatchClaimer: begin a
// transaction and claim a batch in one round trip (the batch claim
// pipelined with BEGIN), so a batch pays no round trip for its BEGIN. The
// messages, the result and the errors are those of Begin followed by
// ClaimBatchTx; invalid parameters are refused before any statement runs
// ([ValidateClaimBatchParams]); on error no transaction is left open.
type BeginBatchClaimer[TTx any] interface {
	BeginClaimBatch(ctx context.Context, p *ClaimBatchParams) (TTx, []ClaimResult, error)
}

// Migrator is an optional capability of a store: create or upgrade its
// tables from the migrations embedded in the store's package. It is
// idempotent and safe to run from several processes at once.
type Migrator interface {
	Migrate(ctx context.Context) error
}

// ClaimParams names one message to claim.
type ClaimParams struct {
	// Consumer is the consumer name.
	Consumer string
	// MessageID is the message ID.
	MessageID string
	// Fingerprint is the payload fingerprint, 1 to MaxFingerprintLength bytes.
	Fingerprint []byte
	// LockTimeout, when positive, bounds how long the claim waits for
	// another transaction holding the same record: past it the claim fails
	// with an error matching ErrLockTimeout, ended by the database itself
	// (PostgreSQL lock_timeout, InnoDB innodb_lock_wait_timeout, for the
	// claim's statements only), so the connection stays usable. Zero
	// leaves the wait to the database's settings and ctx. The core sets it
	// to half of idem.Config.StoreTimeout. A store whose claims never wait
	// on a record (SQLite: the write lock is taken at BEGIN) ignores it.
	LockTimeout time.Duration
	// CallTimeout, when positive, is the bound of each store call of the
	// claim's transaction that a CallTimer store enforces itself (see
	// CallTimer); zero leaves the calls to ctx. The core sets it to
	// idem.Config.StoreTimeout for a store whose TimesCalls is true.
	// Other stores ignore it.
	CallTimeout time.Duration
}

// ClaimBatchParams names the messages of one batch claim.
type ClaimBatchParams struct {
	// Consumer is the consumer name.
	Consumer string
	// Messages are the messages to claim, with distinct IDs.
	Messages []ClaimMessage
	// LockTimeout bounds each wait of the batch's statements on a record
	// another transaction holds, as ClaimParams.LockTimeout does.
	LockTimeout time.Duration
}

// ClaimMessage is one message of a batch claim.
type ClaimMessage struct {
	// MessageID is the message ID.
	MessageID string
	// Fingerprint is the payload fingerprint.
	Fingerprint []byte
}

// ClaimResult is the result of claiming one message.
type ClaimResult struct {
	// Claimed is true when this transaction inserted the record: the
	// message is new and the handler runs. False means a committed record
	// exists.
	Claimed bool
	// Fingerprint is the stored fingerprint when Claimed is false.
	Fingerprint []byte
	// State is the existing record's state when Claimed is false: a record
	// written in lease mode under the same consumer name may be
	// StateInProgress or StateFailed, which the core must not acknowledge
	// as a duplicate. Zero is read as StateCompleted.
	State RecordState
	// Ended is true when the store ended the transaction the claim ran in
	// (rolled it back) before returning: only [BeginClaimer.BeginClaim]
	// sets it, and only with Claimed false (see BeginClaimer). The
	// transaction returned is then the zero TTx and must not be used,
	// committed or rolled back. ClaimTx, ClaimBatchTx and BeginClaimBatch
	// never set it: their caller may go on using the transaction.
	Ended bool
}

// RecordState is the state of a message's record.
type RecordState uint8

// The record states.
const (
	// StateInProgress: an attempt holds (or held, if the lease ran out) a
	// lease on the message.
	StateInProgress RecordState = iota + 1
	// StateCompleted: the message was processed; in lease mode the record
	// keeps the result. Transactional-mode records are completed records.
	StateCompleted
	// StateFailed: the message is poison; the record keeps the last error
	// and the attempt count.
	StateFailed
)

// String returns "in_progress", "completed" or "failed", the names the SQL
// stores write.
func (s RecordState) String() string {
	switch s {
	case StateInProgress:
		return "in_progress"
	case StateCompleted:
		return "completed"
	case StateFailed:
		return "failed"
	}
	return "invalid"
}

// ClaimBatch claims p's messages inside tx on s: with one statement when s
// is a BatchClaimer, otherwise with one ClaimTx per message in the order
// given, which takes the same locks in the same order. It is the path the
// core takes for a batch, for tools and tests that claim directly.
func ClaimBatch[TTx any](ctx context.Context, s TxStore[TTx], tx TTx, p *ClaimBatchParams) ([]ClaimResult, error) {
	if bc, ok := s.(BatchClaimer[TTx]); ok {
		return bc.ClaimBatchTx(ctx, tx, p)
	}
	out := make([]ClaimResult, len(p.Messages))
	for i, m := range p.Messages {
		r, err := s.ClaimTx(ctx, tx, &ClaimParams{Consumer: p.Consumer, MessageID: m.MessageID, Fingerprint: m.Fingerprint, LockTimeout: p.LockTimeout})
		if err != nil {
			return nil, err
		}
		out[i] = r
	}
	return out, nil
}

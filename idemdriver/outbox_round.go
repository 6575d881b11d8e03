package idemdriver

import (
	"context"
	"fmt"
	"time"
)

// OutboxLockedRounder is an optional capability of an [OutboxStore]: run
// a whole relay round (claim, publish, end) in one transaction that holds
// the claimed rows' row locks through the publish, instead of leasing
// them with a write (store/idempgxv5 on PostgreSQL). A claimed row is then
// written once, by its end (deleted, marked sent, or marked for retry or
// failed), where a leased round writes it twice (the lease, then the end).
// [idem.Relay] uses it, when the store has it, with
// RelayConfig.LockedRounds set.
//
// LockedRound(ctx, p) begins a transaction; selects up to p.Limit pending
// rows as ClaimOutgoing would (same order, same per-key rule, rows under
// another relay's live lease left out), locking them, and skipping rows
// another transaction has locked; and, when it found any, calls p.Publish
// with them, in sequence order, each with Attempts one more than its
// count so far. In the same transaction it then ends the rows Publish
// names as sent (deleted, or with Keep marked sent), marks those it names
// as failed (attempts set to the FailedRow's Attempt, its error kept, and
// either available again after RetryAfter or failed for good), and
// commits. A row Publish names in neither is left as it was.
//
// The rows stay locked, unwritten, until that commit: another relay's
// claim skips them, and its per-key check still sees them pending, so a
// key's next row waits for the commit. The store bounds the transaction
// on the server by p.Lease: a relay that stalls (or a Publish that never
// returns) loses its session and its locks once its transaction has been
// idle for p.Lease, and a relay whose connection died cannot commit: its
// rows are claimed again at once, and their messages may go out twice (at
// least once, as with leases). A relay that dies mid-send does not count
// an attempt (nothing was written), so such rows are not backed off.
//
// It returns the number of rows claimed (0: Publish was not called) and
// the error of the claim, of the end or of the commit: with an error
// after Publish was called, nothing of the end committed (unless the
// commit's outcome is unknown), and the rows are claimed again. p is
// checked with [ValidateLockedRoundParams] before anything is sent.
type OutboxLockedRounder interface {
	LockedRound(ctx context.Context, p *LockedRoundParams) (int, error)
}

// LockedRoundParams bound one round of [OutboxLockedRounder].
type LockedRoundParams struct {
	// Limit is the most rows to claim, at least 1.
	Limit int
	// Lease bounds the round's transaction on the server: once it has
	// been idle (between statements, that is while Publish runs) for
	// this long, the server ends the session and its locks. At least a
	// millisecond.
	Lease time.Duration
	// CallTimeout, if not zero, bounds each of the round's two exchanges
	// with the store (the claim; the end and commit) on the client: a
	// connection that stops answering fails the round instead of
	// holding it. The end runs detached from ctx's cancellation (a
	// confirmed row left in place is published again), so that bound is
	// all it has.
	CallTimeout time.Duration
	// Publish is called with the claimed rows (at least one) and returns
	// their outcome: the rows to end as sent, and the failed ones, each
	// named by ID and Seq (FailedRow.Seq must be set). It runs while
	// the rows are locked; ctx is the round's. Mandatory.
	Publish func(ctx context.Context, recs []OutgoingRecord) (sent MarkSentParams, failed []FailedRow)
}

// ValidateLockedRoundParams checks p: Limit at least 1, Lease at least a
// millisecond, CallTimeout not negative, Publish set. Errors match
// ErrInvalidConfig.
func ValidateLockedRoundParams(p *LockedRoundParams) error {
	switch {
	case p == nil:
		return fmt.Errorf("%w: nil LockedRoundParams", ErrInvalidConfig)
	case p.Publish == nil:
		return fmt.Errorf("%w: LockedRoundParams.Publish is nil", ErrInvalidConfig)
	case p.CallTimeout < 0:
		return fmt.Errorf("%w: LockedRoundParams.CallTimeout %v is negative", ErrInvalidConfig, p.CallTimeout)
	}
	return ValidateClaimOutgoingParams(&ClaimOutgoingParams{Limit: p.Limit, Lease: p.Lease})
}

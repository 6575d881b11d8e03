package idem

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Lease-mode sentinel errors.
var (
	// ErrLeaseLost means the fencing token no longer owns the record: the
	// lease expired and another attempt took over (with a higher token), or
	// the record was completed or released. A stale owner's completion,
	// renewal, release or recovery point is rejected with it, loudly, so
	// two attempts never both record a result. Retryable: redeliver, and
	// the redelivery sees what the new owner did.
	ErrLeaseLost = errors.New("idem: lease lost")

	// ErrInProgress means another attempt holds a live lease on the
	// message. Not an ack: redeliver after Outcome.RetryAfter.
	ErrInProgress = errors.New("idem: message in progress")

	// ErrPoison means the message failed for good: it failed MaxAttempts
	// times, or with an error marked Permanent. A terminal record keeps the
	// error and the attempt count so redeliveries do not run it again.
	// Dead-letter it.
	ErrPoison = errors.New("idem: poison message")

	// ErrPermanent marks a handler error that retrying cannot fix (see
	// Permanent). It poisons the message at once: in lease mode with a
	// terminal record, in transactional mode in the Outcome only (the
	// claim rolls back with the effects).
	ErrPermanent = errors.New("idem: permanent failure")
)

// Permanent wraps err so that it matches ErrPermanent (and still err):
// a handler returns it for a failure that no redelivery can fix, such as a
// payment the provider declined, so the Outcome is poison and the message
// is dead-lettered on the first attempt instead of after MaxAttempts (lease
// mode) or the broker's delivery limit (transactional mode). In a batch
// (ProcessBatch) the handler's error fails every claimed message, so a
// Permanent error there does not mark them poison: the adapter retries
// them one by one to find the bad one.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string        { return e.err.Error() }
func (e *permanentError) Unwrap() error        { return e.err }
func (e *permanentError) Is(target error) bool { return target == ErrPermanent }

// RecordState is the state of a message's record in lease mode.
type RecordState uint8

// The record states.
const (
	// StateInProgress: an attempt holds (or held, if the lease expired) a
	// lease on the message.
	StateInProgress RecordState = iota + 1
	// StateCompleted: the message was processed; the record keeps the
	// result. Transactional-mode records are completed records.
	StateCompleted
	// StateFailed: the message is poison; the record keeps the last error
	// and the attempt count.
	StateFailed
)

// String returns "in_progress", "completed" or "failed", the names the
// SQL stores write.
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

// LeaseStore records processed messages in lease mode: for side effects
// outside the database (an HTTP call, an email), where no transaction can
// hold the claim. It is the seam implemented by every store (Redis only
// has this mode) and must pass the idemtest lease cases.
//
// A record moves in_progress -> completed or in_progress -> failed; a
// retryable failure or an expired lease leaves it in_progress, available to
// the next attempt. Every write after Acquire carries the fencing token of
// the attempt and succeeds only while that token owns the record, or fails
// with ErrLeaseLost. A token owns the record from its Acquire until another
// attempt takes over or the token's own Release or Complete: an expired
// lease nobody took over is still owned (a late Complete is kept), a
// released or completed one is not. Tokens of one record are positive and
// strictly increase, so a released record is kept (not deleted): deleting
// it would restart its tokens, its attempt count and its recovery points.
// Lease expiry is judged by the store's clock (the database or Redis
// server's), never the caller's, in one time unit end to end; a lease
// whose end is now has run out. Complete and Release stamp the record's
// time, from which Purge counts the retention window.
type LeaseStore interface {
	// Acquire claims the message or reports its record; see AcquireResult.
	// It acquires when no record exists, or when an in_progress record's
	// lease has expired (or was released) and its fingerprint equals
	// p.Fingerprint: that takeover gets a new, higher token and the next
	// attempt number. Atomic: of concurrent calls, one acquires. A lease
	// that is not positive is refused with an error matching
	// ErrInvalidConfig, never stored as a lease without expiry.
	Acquire(ctx context.Context, p *AcquireParams) (AcquireResult, error)
	// Renew extends the lease of the attempt holding p.Token to now plus
	// p.Lease, or returns ErrLeaseLost.
	Renew(ctx context.Context, p *RenewParams) error
	// Complete marks the record completed with p's result, keeping its
	// fingerprint, while p.Token owns it (even if the lease has expired,
	// provided no other attempt took over); otherwise ErrLeaseLost.
	Complete(ctx context.Context, p *CompleteParams) error
	// Release ends the attempt holding p.Token after a failure: the lease
	// ends now and the record stays in_progress for the next attempt, or,
	// with p.Terminal, becomes failed (poison). The attempt count, the
	// error text and the recovery points are kept. ErrLeaseLost if p.Token
	// does not own the record.
	Release(ctx context.Context, p *ReleaseParams) error
	// SaveStep records a recovery point of the attempt holding p.Token:
	// a completed step and its result, returned to later attempts by
	// Acquire. Saving a step that exists keeps the first result.
	// ErrLeaseLost if p.Token does not own the record.
	SaveStep(ctx context.Context, p *StepParams) error
	// Purge deletes completed and failed records outside the retention
	// window, as TxStore.Purge does; in_progress records are never purged.
	Purge(ctx context.Context, p *PurgeParams) (PurgeResult, error)
}

// AcquireParams names the message to acquire.
type AcquireParams struct {
	// Consumer and MessageID identify the record, already validated.
	Consumer, MessageID string
	// Fingerprint is the payload fingerprint.
	Fingerprint []byte
	// Lease is how long the lease lasts if acquired; positive.
	Lease time.Duration
}

// AcquireResult is what Acquire found or did.
type AcquireResult struct {
	// Acquired is true when this call holds the lease now.
	Acquired bool
	// Token is the fencing token of this attempt when Acquired.
	Token int64
	// Attempt is this attempt's number when Acquired: 1 for the first, one
	// more for each takeover; when not Acquired, the attempts made so far.
	Attempt int
	// Steps are the recovery points saved by earlier attempts, when Acquired.
	Steps map[string][]byte
	// State is the existing record's state when not Acquired.
	State RecordState
	// Fingerprint is the stored fingerprint when not Acquired.
	Fingerprint []byte
	// LeaseRemaining is how long the live lease of an in_progress record
	// has left (server clock), when not Acquired.
	LeaseRemaining time.Duration
	// Result and ContentType are a completed record's stored result. A
	// record completed in transactional mode has none.
	Result      []byte
	ContentType string
	// Error is a failed record's last error text.
	Error string
}

// RenewParams extends a lease.
type RenewParams struct {
	Consumer, MessageID string
	// Token is the fencing token of the attempt.
	Token int64
	// Lease is the new lease, from now; positive.
	Lease time.Duration
}

// CompleteParams completes a record.
type CompleteParams struct {
	Consumer, MessageID string
	// Token is the fencing token of the attempt.
	Token int64
	// Result is stored byte for byte (nil and empty are both stored as
	// empty) and returned to duplicates.
	Result []byte
	// ContentType describes Result, e.g. "application/json"; may be empty.
	ContentType string
}

// ReleaseParams ends a failed attempt.
type ReleaseParams struct {
	Consumer, MessageID string
	// Token is the fencing token of the attempt.
	Token int64
	// Error is the failure's text, kept on the record.
	Error string
	// Terminal makes the record failed (poison) instead of available.
	Terminal bool
}

// StepParams saves a recovery point.
type StepParams struct {
	Consumer, MessageID string
	// Token is the fencing token of the attempt.
	Token int64
	// Step names the step, 1 to 255 bytes.
	Step string
	// Result is the step's result, stored byte for byte.
	Result []byte
}

// ValidateAcquireParams checks p as every store's Acquire does: a valid
// consumer name and message ID (ValidateConsumerName, ValidateMessageID
// with the default maximum), a fingerprint of 1 to MaxFingerprintLength
// bytes (ErrInvalidPayload otherwise), and a positive lease (ErrInvalidConfig
// otherwise: a zero lease never means "no expiry", field case C08). Store
// implementations call it.
func ValidateAcquireParams(p *AcquireParams) error {
	if p.Lease <= 0 {
		return fmt.Errorf("%w: lease %v, want a positive duration", ErrInvalidConfig, p.Lease)
	}
	if err := ValidateConsumerName(p.Consumer); err != nil {
		return err
	}
	if err := ValidateMessageID(p.MessageID, 0); err != nil {
		return err
	}
	if len(p.Fingerprint) == 0 || len(p.Fingerprint) > MaxFingerprintLength {
		return fmt.Errorf("%w: fingerprint of %d bytes, want 1..%d", ErrInvalidPayload, len(p.Fingerprint), MaxFingerprintLength)
	}
	return nil
}

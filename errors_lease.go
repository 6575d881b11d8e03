package idem

import (
	"errors"

	"github.com/idem-go/idem/idemdriver"
)

// Lease-mode sentinel errors.
var (
	// ErrLeaseLost means the fencing token no longer owns the record: the
	// lease expired and another attempt took over (with a higher token), or
	// the record was completed or released. A stale owner's completion,
	// renewal, release or recovery point is rejected with it, loudly, so
	// two attempts never both record a result. Retryable: redeliver, and
	// the redelivery sees what the new owner did.
	ErrLeaseLost = idemdriver.ErrLeaseLost

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

	// ErrOutcomeUnknown marks a failure after which an external effect may
	// or may not have happened: a call was sent and its answer never
	// recorded (the connection broke, or the process died and a later
	// attempt found the call's recovery point without its result). Running
	// it again could do the effect twice, so a Processor that returns it
	// wrapped in Permanent has the message dead-lettered with reason
	// ReasonOutcomeUnknown, for a person or a reconciliation job to decide.
	ErrOutcomeUnknown = errors.New("idem: outcome unknown")
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

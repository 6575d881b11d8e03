package idem

import (
	"errors"
	"fmt"
	"github.com/idem-go/idem/idemdriver"
)

// Sentinel errors. Every error a Consumer or LeaseConsumer returns wraps one
// of these (or is the handler's own error, or a context error), so callers
// branch with [errors.Is]. Store methods called directly return their
// driver's errors as they are, except for the lease-mode sentinels; the
// consumers wrap those with ErrStore.
var (
	// ErrMissingMessageID means the message carries no message ID (an empty
	// ID counts as missing). The producer must set one; the consumer never
	// invents it, because a redelivery would get a new ID and slip past
	// deduplication. Not retryable: dead-letter the message.
	ErrMissingMessageID = idemdriver.ErrMissingMessageID

	// ErrInvalidMessageID means the message ID breaks the ID rules: longer
	// than the configured maximum (255 bytes by default), not valid UTF-8, or
	// holding a NUL or another control character. Not retryable.
	ErrInvalidMessageID = idemdriver.ErrInvalidMessageID

	// ErrInvalidConsumerName means the consumer name is empty, longer than
	// 255 bytes, not valid UTF-8, or holds a control character.
	ErrInvalidConsumerName = idemdriver.ErrInvalidConsumerName

	// ErrInvalidConfig means a Config or store option is out of range.
	ErrInvalidConfig = idemdriver.ErrInvalidConfig

	// ErrInvalidPayload means the fingerprinter could not read the payload,
	// for example a payload that is not JSON under [JSONFingerprint]. Not
	// retryable: the same bytes fail the same way on every redelivery.
	ErrInvalidPayload = idemdriver.ErrInvalidPayload

	// ErrFingerprintMismatch means a record with the same consumer and message
	// ID exists but its payload fingerprint differs: the producer reused an
	// ID for another payload. Under the default [RejectMismatch] policy the
	// message is not processed and should be dead-lettered.
	ErrFingerprintMismatch = errors.New("idem: fingerprint mismatch")

	// ErrHandlerPanic wraps a panic raised by a handler. The transaction was
	// rolled back; the redelivery will run the handler again.
	ErrHandlerPanic = errors.New("idem: handler panicked")

	// ErrStore wraps a failure of the store itself (connection lost, timeout,
	// a constraint other than the claim's). Retryable: nothing was recorded.
	ErrStore = errors.New("idem: store error")

	// ErrPurgeInProgress means another cleaner holds the purge lock for this
	// store and consumer; only one runs at a time. Try again later.
	ErrPurgeInProgress = idemdriver.ErrPurgeInProgress

	// ErrClosed is returned by a Consumer after Close.
	ErrClosed = errors.New("idem: consumer closed")
)

// PanicError is the error a handler's panic becomes. It matches
// [ErrHandlerPanic] with [errors.Is] and keeps the recovered value and the
// stack of the panicking goroutine.
type PanicError struct {
	// Value is what the handler passed to panic.
	Value any
	// Stack is the goroutine stack captured at recovery, as runtime/debug.Stack prints it.
	Stack []byte
}

// Error implements error.
func (e *PanicError) Error() string { return fmt.Sprintf("idem: handler panicked: %v", e.Value) }

// Is reports whether target is [ErrHandlerPanic].
func (e *PanicError) Is(target error) bool { return target == ErrHandlerPanic }

// Unwrap returns the panic value when it is an error, so a panic(err) stays
// inspectable with errors.Is and errors.As.
func (e *PanicError) Unwrap() error {
	if err, ok := e.Value.(error); ok {
		return err
	}
	return nil
}

// IsPermanent reports whether err says the message can never be processed as
// it is (missing or invalid message ID, invalid payload, fingerprint
// mismatch, poison, or a handler error marked with Permanent), so
// redelivering it is pointless and it belongs in a dead letter.
// Every other error from Process is worth a redelivery.
func IsPermanent(err error) bool {
	return errors.Is(err, ErrMissingMessageID) ||
		errors.Is(err, ErrInvalidMessageID) ||
		errors.Is(err, ErrInvalidPayload) ||
		errors.Is(err, ErrFingerprintMismatch) ||
		errors.Is(err, ErrPoison) ||
		errors.Is(err, ErrPermanent)
}

// storeError wraps err so it matches ErrStore while keeping the driver's own
// error (a *pgconn.PgError, a *mysql.MySQLError) reachable with errors.As.
func storeError(op string, err error) error {
	if err == nil || errors.Is(err, ErrStore) {
		return err
	}
	return fmt.Errorf("%w: %s: %w", ErrStore, op, err)
}

package idem

import "time"

// Status says what happened to one delivery of a message.
type Status uint8

// The statuses a delivery can end in. The zero Status is invalid, so an
// Outcome that was never filled in is never mistaken for a success.
const (
	// Processed: this delivery claimed the message and the handler's effects
	// committed with the claim. Acknowledge it.
	Processed Status = iota + 1
	// Duplicate: the message was already processed (by an earlier delivery,
	// a concurrent copy, or another member of the consumer group). The
	// handler was not called. Acknowledge it and do nothing else.
	Duplicate
	// InProgress: another delivery holds a live lease on the message (lease
	// mode), or, in transactional mode, another transaction held the
	// message's record for longer than the claim's lock timeout (see
	// ErrLockTimeout). Not an ack: redeliver after Outcome.RetryAfter.
	InProgress
	// FingerprintMismatch: the message ID was processed with another payload.
	// The handler was not called. Dead-letter it (a producer bug).
	FingerprintMismatch
	// Failed: the handler or the store failed; the claim and the effects
	// were rolled back together. Do not acknowledge; the redelivery runs the
	// handler again.
	Failed
	// Rejected: the message cannot be processed as delivered (missing or
	// invalid message ID, unreadable payload). The handler was not called and
	// nothing was recorded. Dead-letter it; never acknowledge it as done.
	Rejected
)

// String returns the status name as written in this package, e.g. "Duplicate".
func (s Status) String() string {
	switch s {
	case Processed:
		return "Processed"
	case Duplicate:
		return "Duplicate"
	case InProgress:
		return "InProgress"
	case FingerprintMismatch:
		return "FingerprintMismatch"
	case Failed:
		return "Failed"
	case Rejected:
		return "Rejected"
	}
	return "Status(invalid)"
}

// Outcome is the result of processing one delivery.
type Outcome struct {
	// Status says what happened.
	Status Status
	// MessageID is the ID of the delivery, as given.
	MessageID string
	// Err is the cause for FingerprintMismatch, Failed and Rejected, and for
	// InProgress (an error matching ErrInProgress, lease mode); nil for
	// Processed and Duplicate. It is the same error Process returns.
	Err error
	// MismatchAccepted is true when Status is Duplicate only because the
	// [AcceptMismatchAsDuplicate] policy turned a fingerprint mismatch into
	// a duplicate.
	MismatchAccepted bool
	// RetryAfter is how long to wait before redelivering an InProgress
	// message; for a Failed one, a Processor may set it to ask for a
	// longer wait than the adapter's retry delay (Settle takes the longer
	// of the two); zero otherwise.
	RetryAfter time.Duration
	// Result and ContentType are the stored result in lease mode: what the
	// handler returned (Processed), or what the first processing stored
	// (Duplicate), byte for byte, so a request/reply consumer answers a
	// redelivery with the first answer.
	Result      []byte
	ContentType string
	// Attempt is the lease-mode attempt number that ran (Processed,
	// Failed) or the attempts made so far (InProgress, Duplicate, poison).
	Attempt int
	// Poison is true for a Failed outcome that will never be retried: the
	// message failed MaxAttempts times (lease mode), or its handler
	// returned an error matching ErrPermanent (see Permanent; both modes,
	// single messages only). Dead-letter it.
	Poison bool
}

// Ack reports whether the broker may be told the delivery is done: true for
// Processed and Duplicate, and for nothing else. Broker adapters use
// [Outcome.Settle], which makes the whole decision (and refuses to ack an
// ackable Status that carries an error).
func (o Outcome) Ack() bool { return o.Status == Processed || o.Status == Duplicate }

// DeadLetter reports whether the delivery can never succeed as it is
// (FingerprintMismatch, Rejected, or a poison Failed) and belongs in a dead
// letter with Err as the reason. Other Failed and InProgress deliveries are
// redelivered instead. [Outcome.Settle] also dead-letters a Failed outcome
// whose Err matches [IsPermanent] without Poison set, and says why.
func (o Outcome) DeadLetter() bool {
	return o.Status == FingerprintMismatch || o.Status == Rejected || o.Poison
}

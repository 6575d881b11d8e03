package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Action is what a broker adapter does with one delivery once its Outcome
// is known. The Idempotent Consumer pattern allows exactly three: tell the
// broker the delivery is done, let the broker deliver it again, or move it
// to a dead letter because no redelivery can ever succeed.
type Action uint8

// The actions. The zero Action is invalid.
const (
	// Ack: the delivery is done (acknowledge it, commit its offset). The
	// message was processed now or before.
	Ack Action = iota + 1
	// Redeliver: do not acknowledge; have the broker deliver it again after
	// Settlement.Delay (a nak with delay, a held requeue, a shortened idle
	// time, an in-place retry).
	Redeliver
	// DeadLetter: publish the message, byte for byte, to the adapter's dead
	// letter with the headers of Settlement.DeadLetterHeaders, and only once
	// the broker has the dead letter acknowledge the original.
	DeadLetter
)

// String returns the action's name, e.g. "DeadLetter".
func (a Action) String() string {
	switch a {
	case Ack:
		return "Ack"
	case Redeliver:
		return "Redeliver"
	case DeadLetter:
		return "DeadLetter"
	}
	return "Action(invalid)"
}

// The reasons of a Settlement: stable, machine-readable words for why an
// action was taken. A dead letter carries its reason in
// [HeaderDeadLetterReason]; alerting and replay tools branch on it, so a
// reason's spelling never changes.
const (
	// Ack reasons.
	ReasonProcessed = "processed" // the handler ran and its effects committed
	ReasonDuplicate = "duplicate" // already processed; the handler did not run

	// Redeliver reasons.
	ReasonInProgress = "in-progress" // another delivery holds the lease (lease mode)
	ReasonFailed     = "failed"      // the handler or the store failed; rolled back

	// DeadLetter reasons.
	ReasonMissingMessageID    = "missing-message-id"   // ErrMissingMessageID
	ReasonInvalidMessageID    = "invalid-message-id"   // ErrInvalidMessageID
	ReasonInvalidPayload      = "invalid-payload"      // ErrInvalidPayload
	ReasonFingerprintMismatch = "fingerprint-mismatch" // ErrFingerprintMismatch
	ReasonRejected            = "rejected"             // Rejected for another cause
	ReasonPermanent           = "permanent"            // a handler error marked with Permanent
	ReasonTooManyDeliveries   = "too-many-deliveries"  // ErrTooManyDeliveries: the broker's delivery limit
	ReasonPoison              = "poison"               // ErrPoison: failed MaxAttempts times (lease mode)
	ReasonOutcomeUnknown      = "outcome-unknown"      // ErrOutcomeUnknown: an effect may have happened; not run again
)

// Settlement is the broker-independent decision for one delivery: what to
// do with it, after how long, and why. Broker adapters get it from
// [Outcome.Settle] and only translate it to their broker; none of them
// decides anything on its own.
type Settlement struct {
	// Action is what to do with the delivery.
	Action Action
	// Delay is how long to wait before the redelivery (Action Redeliver
	// only; zero otherwise): the Outcome's RetryAfter for InProgress (what
	// is left of the other delivery's lease), the adapter's retry delay for
	// Failed, or the Outcome's RetryAfter when that is longer (a Processor
	// that backs off, or honours a Retry-After it was given).
	Delay time.Duration
	// Reason is one of the Reason constants: why Action was chosen.
	Reason string
	// Status and MessageID are the Outcome's.
	Status    Status
	MessageID string
	// Err is the Outcome's error: nil for Ack, never nil otherwise (an
	// Outcome without an error gets one naming its Status).
	Err error
}

// Settle decides what a broker adapter does with the delivery that ended in
// o, as the Idempotent Consumer pattern says:
//
//   - Processed and Duplicate without an error: Ack. A duplicate is
//     acknowledged and ignored, never processed again.
//   - InProgress: Redeliver after o.RetryAfter (or retryDelay when it is
//     not positive). Another delivery holds the lease; this one must not
//     be acknowledged, because that delivery may still fail.
//   - Rejected, FingerprintMismatch, and Failed when o.Poison is set or
//     o.Err says no retry can help ([IsPermanent]): DeadLetter. Such a
//     message fails the same way on every redelivery; redelivering it would
//     block its queue or partition for ever, and dropping it would lose it.
//   - Failed otherwise, and anything else (an invalid Status, an ackable
//     Status with an error): Redeliver after retryDelay, or after
//     o.RetryAfter when that is longer. The claim and the
//     effects were rolled back together, so the redelivery runs the
//     handler again; nothing that went wrong is ever acknowledged as done.
//
// retryDelay is the adapter's configured delay before a failed delivery
// comes back (its Config.RetryDelay), a duration of at least zero; Settle
// does not apply defaults. Run the Outcome through [Guard] first so that a
// panicking or careless Processor cannot produce an Outcome worth acking.
func (o Outcome) Settle(retryDelay time.Duration) Settlement {
	s := Settlement{Status: o.Status, MessageID: o.MessageID, Err: o.Err}
	switch {
	case (o.Status == Processed || o.Status == Duplicate) && o.Err == nil:
		s.Action, s.Reason = Ack, ReasonProcessed
		if o.Status == Duplicate {
			s.Reason = ReasonDuplicate
		}
		return s
	case o.Status == InProgress:
		s.Action, s.Reason, s.Delay = Redeliver, ReasonInProgress, o.RetryAfter
		if s.Delay <= 0 {
			s.Delay = retryDelay
		}
	case o.Status == Rejected, o.Status == FingerprintMismatch,
		o.Status == Failed && (o.Poison || IsPermanent(o.Err)):
		s.Action, s.Reason = DeadLetter, deadLetterReason(o)
	default:
		s.Action, s.Reason, s.Delay = Redeliver, ReasonFailed, max(retryDelay, o.RetryAfter)
	}
	if s.Err == nil {
		s.Err = fmt.Errorf("idem: %s outcome without an error", o.Status)
	}
	return s
}

// deadLetterReason names why o is dead-lettered, from the most specific
// cause its error matches.
func deadLetterReason(o Outcome) string {
	switch {
	case o.Status == FingerprintMismatch || errors.Is(o.Err, ErrFingerprintMismatch):
		return ReasonFingerprintMismatch
	case errors.Is(o.Err, ErrMissingMessageID):
		return ReasonMissingMessageID
	case errors.Is(o.Err, ErrInvalidMessageID):
		return ReasonInvalidMessageID
	case errors.Is(o.Err, ErrInvalidPayload):
		return ReasonInvalidPayload
	case o.Status == Rejected:
		return ReasonRejected
	case errors.Is(o.Err, ErrTooManyDeliveries):
		return ReasonTooManyDeliveries
	case errors.Is(o.Err, ErrOutcomeUnknown):
		return ReasonOutcomeUnknown
	case errors.Is(o.Err, ErrPermanent):
		return ReasonPermanent
	}
	return ReasonPoison
}

// The header (or field) names of a dead letter, the same in every broker
// adapter. An adapter adds them to the original message's own headers (or
// fields), whose payload it keeps byte for byte, and may add headers that
// locate the original in its broker, named Idem-Original-<what> (for
// example Idem-Original-Topic, Idem-Original-Offset).
const (
	// HeaderDeadLetterReason is Settlement.Reason, e.g.
	// "invalid-message-id": what to branch on.
	HeaderDeadLetterReason = "Idem-Dead-Letter-Reason"
	// HeaderDeadLetterError is the text of Settlement.Err: what a person
	// reads, e.g. `idem: invalid message ID: holds a control character`.
	HeaderDeadLetterError = "Idem-Dead-Letter-Error"
	// HeaderDeadLetterStatus is the Outcome's Status, e.g. "Rejected".
	HeaderDeadLetterStatus = "Idem-Dead-Letter-Status"
	// HeaderOriginalMessageID is the message ID the adapter read from the
	// original; absent when it had none.
	HeaderOriginalMessageID = "Idem-Original-Message-Id"
)

// DeadLetterHeaders returns the headers every dead letter carries, by name
// ([HeaderDeadLetterReason], [HeaderDeadLetterError],
// [HeaderDeadLetterStatus], and [HeaderOriginalMessageID] when the message
// had an ID), their values as they are; an adapter whose broker limits
// header values (one line, a length) makes them fit.
func (s Settlement) DeadLetterHeaders() map[string]string {
	h := map[string]string{
		HeaderDeadLetterReason: s.Reason,
		HeaderDeadLetterStatus: s.Status.String(),
	}
	if s.Err != nil {
		h[HeaderDeadLetterError] = s.Err.Error()
	}
	if s.MessageID != "" {
		h[HeaderOriginalMessageID] = s.MessageID
	}
	return h
}

// Level is the log level of the Settlement, the same in every adapter:
// debug for Ack (duplicates included: they are the pattern working, not a
// problem), for InProgress, and for a redelivery whose error matches
// context.Canceled (the delivery's own context ended: the consumer is
// stopping); warn for a dead letter and for a handler
// failure that will be redelivered; error for a failure of the store
// ([ErrStore]) or a panic ([ErrHandlerPanic]), which no redelivery fixes
// until someone looks.
func (s Settlement) Level() slog.Level {
	switch {
	case s.Action == Ack || s.Reason == ReasonInProgress:
		return slog.LevelDebug
	case s.Action == DeadLetter:
		return slog.LevelWarn
	case s.Action == Redeliver && errors.Is(s.Err, context.Canceled):
		// The delivery's own context was cancelled (the consumer
		// stopping): not a failure of the store it wraps.
		return slog.LevelDebug
	case errors.Is(s.Err, ErrStore) || errors.Is(s.Err, ErrHandlerPanic):
		return slog.LevelError
	}
	return slog.LevelWarn
}

// Log logs the Settlement once it has been carried out, at s.Level(), with
// the message "<adapter>: <what happened>" and the attributes message_id,
// status, reason, then delay (Redeliver) and err (when not nil), then
// attrs (the broker's location of the delivery). adapter is the adapter's
// package name, e.g. "idemamqp".
func (s Settlement) Log(ctx context.Context, l *slog.Logger, adapter string, attrs ...any) {
	level := s.Level()
	if !l.Enabled(ctx, level) {
		return
	}
	var what string
	switch s.Action {
	case Ack:
		what = "message acknowledged"
	case Redeliver:
		what = "message left for redelivery"
	case DeadLetter:
		what = "message dead-lettered"
	default:
		what = "message settled"
	}
	args := make([]any, 0, 10+len(attrs))
	args = append(args, "message_id", s.MessageID, "status", s.Status.String(), "reason", s.Reason)
	if s.Action == Redeliver {
		args = append(args, "delay", s.Delay)
	}
	if s.Err != nil {
		args = append(args, "err", s.Err)
	}
	l.Log(ctx, level, adapter+": "+what, append(args, attrs...)...)
}

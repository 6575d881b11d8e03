package idemdriver

import (
	"context"
	"time"
)

// LeaseStore records processed messages in lease mode: for side effects
// outside the database (an HTTP call, an email), where no transaction can
// hold the claim. Every store implements it (Redis has only this mode), and
// it passes the idemtest lease cases.
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
// time, from which retention counts. Every method refuses invalid
// parameters before it talks to its database (the Validate functions of
// this package): ValidateAcquireParams, ValidateRenewParams,
// ValidateCompleteParams, ValidateReleaseParams, ValidateStepParams.
type LeaseStore interface {
	Retainer
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
}

// AcquireParams names the message to acquire.
type AcquireParams struct {
	// Consumer and MessageID identify the record.
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
	// Consumer and MessageID identify the record.
	Consumer, MessageID string
	// Token is the fencing token of the attempt.
	Token int64
	// Lease is the new lease, from now; positive.
	Lease time.Duration
}

// CompleteParams completes a record.
type CompleteParams struct {
	// Consumer and MessageID identify the record.
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
	// Consumer and MessageID identify the record.
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
	// Consumer and MessageID identify the record.
	Consumer, MessageID string
	// Token is the fencing token of the attempt.
	Token int64
	// Step names the step (ValidateStepName).
	Step string
	// Result is the step's result, stored byte for byte.
	Result []byte
}

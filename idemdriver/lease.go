package idemdriver

import (
	"context"
	"strconv"
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
	// ErrInvalidConfig, never stored as a lease without expiry. A store
	// that implements StepRecorder also saves p.StepPrefix's recovery
	// point in the same atomic write; see AcquireParams.StepPrefix.
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
	// does not own the record. A store that implements StepRecorder also
	// saves p.Step in the same atomic write; see ReleaseParams.Step.
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
	// StepPrefix, when not empty, asks a StepRecorder store to save, in
	// the write that acquires, a recovery point of the acquiring attempt:
	// the step named StepPrefix followed by the new token in decimal
	// ("idemhttp:run:" and token 7 make "idemhttp:run:7"), with an empty
	// result, exactly as a SaveStep under that token right after the
	// acquisition would (a step of that name that exists keeps its first
	// result). Acquisition and point are one atomic write: no other call
	// sees the record acquired without the point, and a failed Acquire
	// saves neither. Nothing is saved when Acquire does not acquire.
	// AcquireResult.Steps does not hold the point: it reports only what
	// was saved before this acquisition. StepPrefix plus the longest token
	// (19 digits) must be a valid step name (ValidateStepName). A store
	// that does not implement StepRecorder is never given one: the core
	// then saves the point with SaveStep.
	StepPrefix string
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
	// Steps are the recovery points saved by earlier attempts, when
	// Acquired: never the point that AcquireParams.StepPrefix saved.
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
	// Step, when not empty, asks a StepRecorder store to save, in the
	// write that releases, the recovery point Step of the releasing
	// attempt, with an empty result, as a SaveStep under p.Token just
	// before the release would (a step that exists keeps its first
	// result): both happen, while p.Token owns the record, or neither
	// (ErrLeaseLost). Step must be a valid step name (ValidateStepName).
	// A store that does not implement StepRecorder is never given one:
	// the core then saves the point with SaveStep first.
	Step string
}

// StepRecorder is an optional capability of a LeaseStore, found by type
// assertion: its Acquire honours AcquireParams.StepPrefix and its Release
// honours ReleaseParams.Step, each saving the recovery point in the same
// atomic write (one statement, one transaction or one script) as the
// acquisition or the release, so that an attempt that records a point
// before it acts, and again when it releases, costs no store call of its
// own for either. RecordsSteps returns true when the store does so; a
// wrapper around a store should implement it by asking the store it
// wraps. A store that lacks the method (written before these fields
// existed) need do nothing: the core never sets the fields for it and
// saves the points with SaveStep, one more call each.
type StepRecorder interface {
	LeaseStore
	// RecordsSteps reports whether Acquire and Release save the points
	// named by AcquireParams.StepPrefix and ReleaseParams.Step.
	RecordsSteps() bool
}

// RecordsSteps reports whether s is a StepRecorder whose RecordsSteps is
// true.
func RecordsSteps(s LeaseStore) bool {
	r, ok := s.(StepRecorder)
	return ok && r.RecordsSteps()
}

// PrefixStep returns the name of the recovery point that
// AcquireParams.StepPrefix prefix names for token: prefix followed by the
// token in decimal.
func PrefixStep(prefix string, token int64) string {
	return prefix + strconv.FormatInt(token, 10)
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

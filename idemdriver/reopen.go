package idemdriver

import (
	"context"
	"fmt"
)

// ErrTokenMoved means an operator action guarded by a fencing token found
// the record under a later token in a state the action does not expect:
// a reopened record was delivered and completed (or failed) again since
// it was read. The action changed nothing; read the record again to
// decide. It also matches ErrWrongState.
var ErrTokenMoved = fmt.Errorf("%w: the record's token moved", ErrWrongState)

// Reopener is an optional capability of a lease store, for replaying a
// message whose record was completed with an outcome that has to be
// undone: the idem command's replay of a dead letter that `idem consume`
// completed with a service's refusal (a 4xx answer) or an unknown
// outcome, once the service is fixed (see idemhttp.DeadLetterAnswer).
// RetryRecord does the same for a failed record.
type Reopener interface {
	// ReopenRecord makes the completed record of (p.Consumer,
	// p.MessageID) that p.Token completed retryable again, in one atomic
	// write: in progress, its lease ended and no attempt holding it, its
	// attempt count 0 (the next delivery is attempt 1 of a fresh round),
	// a new fencing token, its stored result gone, and its recovery
	// points (LeaseStore.SaveStep) deleted, so that the next attempt
	// starts from the beginning: it is not taken for the takeover of an
	// attempt that died after an external call. Its fingerprint is kept.
	//
	// It is guarded by p.Token, as read by Inspect: a record completed
	// under another token is not reopened. A record in progress under a
	// later token (this reopen, repeated; another one; or a release)
	// reports Changed false. A record completed or failed under a later
	// token (reopened, then delivered again since it was read) is an
	// error matching ErrTokenMoved; one that p.Token does not hold
	// completed (in progress or failed under it, or under an earlier
	// token, or a transactional record) matches ErrWrongState; a missing
	// one matches ErrNotFound. Those change nothing.
	ReopenRecord(ctx context.Context, p *ReopenRecordParams) (ActionResult, error)
}

// ReopenRecordParams name the completed record to reopen.
type ReopenRecordParams struct {
	// Consumer and MessageID identify the record.
	Consumer, MessageID string
	// Token is the fencing token of the attempt that completed the
	// record, as Inspect read it; positive.
	Token int64
}

// ValidateReopenRecordParams checks a valid key and a positive token.
// Errors match ErrInvalidConsumerName, ErrInvalidMessageID,
// ErrMissingMessageID or ErrInvalidConfig.
func ValidateReopenRecordParams(p *ReopenRecordParams) error {
	return validateKeyToken(p.Consumer, p.MessageID, p.Token, "reopen of token %d, want the one that completed the record (>= 1)")
}

// CheckReopen says why a ReopenRecord of token changed nothing on rec,
// the record as it is after the attempt: nil when rec is in progress
// under a later token (reopened already: Changed false), an error
// matching ErrTokenMoved when rec is completed or failed under a later
// token, and one matching ErrWrongState otherwise. A helper for stores
// that implement [Reopener].
func CheckReopen(rec Record, token int64) error {
	switch {
	case rec.Token > token && rec.State == StateInProgress:
		return nil
	case rec.Token > token:
		return fmt.Errorf("%w: consumer %q, message ID %q is %s under token %d, after token %d that was to be reopened: it was reopened and delivered again since",
			ErrTokenMoved, rec.Consumer, rec.MessageID, rec.State, rec.Token, token)
	case rec.State != StateCompleted:
		return fmt.Errorf("%w: consumer %q, message ID %q is %s; only a completed record can be reopened (a failed one is retried)",
			ErrWrongState, rec.Consumer, rec.MessageID, rec.State)
	}
	return fmt.Errorf("%w: consumer %q, message ID %q was completed under token %d, not %d", ErrWrongState, rec.Consumer, rec.MessageID, rec.Token, token)
}

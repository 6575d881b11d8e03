package console

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem/idemdriver"
)

// The actions.
const (
	// ActionRetry makes a failed (poisoned) record retryable.
	ActionRetry = "retry"
	// ActionRetryOutbox makes a failed outbox row pending again.
	ActionRetryOutbox = "retry-outbox"
	// ActionRelease ends the lease of the attempt holding a token.
	ActionRelease = "release"
)

// ErrBadAction marks an action whose parameters are missing or unknown.
var ErrBadAction = errors.New("bad action")

// ErrNoOutbox means the store has no outbox capabilities.
var ErrNoOutbox = errors.New("the store has no outbox")

// Action is one operator action and its target.
type Action struct {
	Kind      string
	Consumer  string
	MessageID string
	OutboxID  string
	// Token is the holder's fencing token, for ActionRelease.
	Token int64
}

// Check refuses an action with a missing or unknown part, with an error
// matching ErrBadAction.
func (a Action) Check() error {
	switch a.Kind {
	case ActionRetry:
		if a.Consumer == "" || a.MessageID == "" {
			return fmt.Errorf("%w: retry needs a consumer and a message ID", ErrBadAction)
		}
	case ActionRelease:
		if a.Consumer == "" || a.MessageID == "" || a.Token < 1 {
			return fmt.Errorf("%w: release needs a consumer, a message ID and the holder's fencing token", ErrBadAction)
		}
	case ActionRetryOutbox:
		if a.OutboxID == "" {
			return fmt.Errorf("%w: an outbox retry needs the row's ID", ErrBadAction)
		}
	default:
		return fmt.Errorf("%w: unknown action %q (want %s, %s or %s)", ErrBadAction, a.Kind, ActionRetry, ActionRelease, ActionRetryOutbox)
	}
	return nil
}

// String names the action and its target, for logs and pages.
func (a Action) String() string {
	switch a.Kind {
	case ActionRetryOutbox:
		return fmt.Sprintf("retry outbox row %q", a.OutboxID)
	case ActionRelease:
		return fmt.Sprintf("release the lease of token %d on message %q of consumer %q", a.Token, a.MessageID, a.Consumer)
	}
	return fmt.Sprintf("make message %q of consumer %q retryable", a.MessageID, a.Consumer)
}

// Run checks a and runs it on st: one store call. The record's view is
// taken at now() read after the call (its age, whether its lease is
// live), so that it shows the record as the action left it. Errors match
// ErrBadAction, ErrNoOutbox, idemdriver.ErrNotFound, ErrWrongState or the
// store's validation errors; nothing changed then.
func Run(ctx context.Context, st Store, a Action, now func() time.Time) (ActionView, error) {
	if err := a.Check(); err != nil {
		return ActionView{}, err
	}
	v := ActionView{Action: a.Kind, Consumer: a.Consumer, MessageID: a.MessageID, OutboxID: a.OutboxID}
	var (
		res idemdriver.ActionResult
		err error
	)
	switch a.Kind {
	case ActionRetryOutbox:
		op, _, ok := outboxOf(st)
		if !ok {
			return ActionView{}, ErrNoOutbox
		}
		if res, err = op.RetryOutgoing(ctx, a.OutboxID); err != nil {
			return ActionView{}, err
		}
		v.Consumer, v.Changed = res.Record.Consumer, res.Changed
		v.Message = pick(res.Changed, "outbox row %q is pending again: the relay sends it next", "outbox row %q was pending already: nothing changed", a.OutboxID)
		return v, nil
	case ActionRelease:
		res, err = st.ReleaseLease(ctx, &idemdriver.ReleaseLeaseParams{Consumer: a.Consumer, MessageID: a.MessageID, Token: a.Token})
		if err == nil {
			v.Message = pick(res.Changed, "released the lease of token %d: the next delivery takes the message over",
				"token %d no longer held the record: nothing changed", a.Token)
		}
	default:
		res, err = st.RetryRecord(ctx, a.Consumer, a.MessageID)
		if err == nil {
			v.Message = pick(res.Changed, "message %q is retryable: the next delivery processes it as attempt 1",
				"message %q was retryable already (in progress): nothing changed", a.MessageID)
		}
	}
	if err != nil {
		return ActionView{}, err
	}
	rv := NewRecordView(res.Record, now())
	v.Changed, v.Record = res.Changed, &rv
	return v, nil
}

func pick(changed bool, yes, no string, arg any) string {
	if changed {
		return fmt.Sprintf(yes, arg)
	}
	return fmt.Sprintf(no, arg)
}

package console

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem"
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
	// ActionReplay makes a dead letter's record retryable (a failed
	// record retried, one completed with the dead letter's outcome
	// reopened) and republishes the dead letter to its source with the
	// same message ID.
	ActionReplay = "replay"
	// ActionPurge deletes a consumer's records outside a retention window
	// now (idem.Purge).
	ActionPurge = "purge"
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
	// DeadLetter and Position locate the dead letter of ActionReplay.
	DeadLetter, Position string
	// Force replays a dead letter whose record is retryable already (in
	// progress, no live lease): a retry made without a publish, or a
	// replay the broker dropped.
	Force bool
	// OlderThan is ActionPurge's retention window, in running time of the
	// consumer.
	OlderThan time.Duration
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
	case ActionReplay:
		if a.Consumer == "" || a.DeadLetter == "" || a.Position == "" {
			return fmt.Errorf("%w: replay needs the consumer, the dead-letter destination and the dead letter's position", ErrBadAction)
		}
	case ActionPurge:
		if a.Consumer == "" || a.OlderThan <= 0 || a.OlderThan > idem.MaxRetentionWindow {
			return fmt.Errorf("%w: purge needs a consumer and a positive retention window (older than), at most %s", ErrBadAction, idem.MaxRetentionWindow)
		}
	default:
		return fmt.Errorf("%w: unknown action %q (want %s, %s, %s, %s or %s)", ErrBadAction, a.Kind, ActionRetry, ActionRelease, ActionRetryOutbox, ActionReplay, ActionPurge)
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
	case ActionReplay:
		force := ""
		if a.Force {
			force = " (forced: even if its record is retryable already)"
		}
		return fmt.Sprintf("replay dead letter %s of %s to its source, its record of consumer %q made retryable first%s", a.Position, a.DeadLetter, a.Consumer, force)
	case ActionPurge:
		return fmt.Sprintf("delete now the records of consumer %q outrun by %s of running time", a.Consumer, a.OlderThan)
	}
	return fmt.Sprintf("make message %q of consumer %q retryable", a.MessageID, a.Consumer)
}

// Run checks a and runs it on st (and dls, for a replay; nil without a
// broker): one store call, or for a replay the calls Replay describes,
// or for a purge idem.Purge. The record's view is taken at now() read
// after the call (its age, whether its lease is live), so that it shows
// the record as the action left it. Errors match ErrBadAction,
// ErrNoOutbox, ErrNoBroker, ErrNoDeadLetter, ErrNotReplayable,
// ErrReplayDropped, idemdriver.ErrNotFound, ErrWrongState,
// idem.ErrPurgeInProgress or the store's validation errors; nothing
// changed then (but see Replay for ErrReplayDropped).
func Run(ctx context.Context, st Store, dls DeadLetters, a Action, now func() time.Time) (ActionView, error) {
	if err := a.Check(); err != nil {
		return ActionView{}, err
	}
	switch a.Kind {
	case ActionReplay:
		return Replay(ctx, st, dls, a, now)
	case ActionPurge:
		return purge(ctx, st, a)
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

// purge runs idem.Purge for a's consumer and window: a second purge finds
// nothing more to delete and says so, naming an unknown consumer as such.
func purge(ctx context.Context, st Store, a Action) (ActionView, error) {
	r, ok := st.(idemdriver.Retainer)
	if !ok {
		return ActionView{}, fmt.Errorf("%w: this store keeps no runs to purge by", idemdriver.ErrUnsupported)
	}
	res, err := idem.Purge(ctx, r, idem.PurgeParams{Consumer: a.Consumer, RetentionWindow: a.OlderThan, BatchSize: idem.DefaultPurgeBatchSize})
	if err != nil {
		return ActionView{}, err
	}
	v := ActionView{Action: a.Kind, Consumer: a.Consumer, Changed: res.Deleted > 0, Deleted: &res.Deleted}
	if res.Deleted > 0 {
		v.Message = fmt.Sprintf("deleted %d records of consumer %q outrun by %s of running time (horizon %s)", res.Deleted, a.Consumer, a.OlderThan, res.Horizon.UTC().Format(time.RFC3339))
	} else {
		v.Message = fmt.Sprintf("no record of consumer %q is outrun by %s of running time: nothing changed", a.Consumer, a.OlderThan)
		if err := KnownConsumer(ctx, st, a.Consumer); errors.Is(err, ErrUnknownConsumer) {
			v.Message += " (" + err.Error() + ")"
		}
	}
	return v, nil
}

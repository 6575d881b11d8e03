package console

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/idemhttp"
)

// Replay replays the dead letter a names to its source, so that its
// consumer processes it once:
//
//  1. It reads the dead letter (ErrNoDeadLetter when none is there) and
//     refuses one without a usable message ID (missing-message-id,
//     invalid-message-id): its copy would be dead-lettered again.
//  2. It reads the record of the message ID under a.Consumer. A completed
//     record whose stored result is a dead-letter answer of idem consume
//     (idemhttp.DeadLetterAnswer: the service's final 4xx or 3xx answer,
//     or an unknown outcome, which the Deliverer settles every copy with)
//     is to be reopened (step 4); on a store that cannot reopen records
//     (no idemdriver.Reopener) it is refused with ErrRecordedOutcome. Any
//     other completed record is refused: it holds a success (processed
//     already, by an earlier replay or a redelivery), which a copy would
//     be settled with without running. A record in progress is refused:
//     an earlier replay or retry made it retryable and its delivery is
//     awaited, or an attempt holds it; with a.Force, one without a live
//     lease is replayed anyway (a retry made without a publish, or a
//     replay the broker dropped), and so is one whose attempt count is 0
//     (retried or reopened, no attempt since: nobody holds it, whatever
//     the store's clock says of the lease). No record at all (a message
//     dead-lettered before it had one) is replayed as a new message.
//  3. It asks the broker whether a copy would reach the consumer
//     (DeadLetters.Replayable): a JetStream stream drops a copy whose
//     message ID it saw within its duplicate window, so that is refused
//     before anything changes, with the time after which it is not.
//  4. It makes a failed record retryable (idemdriver.Operator.RetryRecord),
//     or reopens a completed one by the token that completed it
//     (idemdriver.Reopener.ReopenRecord: its result and recovery points
//     go, so the copy calls the service again); an action that changed
//     nothing means another replay or retry won the race, and is refused
//     unless forced, and a record changed since step 2 is refused.
//  5. It republishes the dead letter with the same message ID. If the
//     broker still drops it (ErrReplayDropped), the record stays
//     retryable and the error says to replay with force later.
//
// The consumer processes the copy once: it is the record's first delivery
// since the retry, and any other copy is a duplicate of it. Refusals
// match ErrNotReplayable (and idemdriver.ErrWrongState), and nothing was
// changed or published; those a forced replay would publish (a record
// retryable already, a copy the broker dropped) match ErrForceable too.
func Replay(ctx context.Context, st Store, dls DeadLetters, a Action, now func() time.Time) (ActionView, error) {
	if err := a.Check(); err != nil {
		return ActionView{}, err
	}
	if dls == nil {
		return ActionView{}, ErrNoBroker
	}
	dl, err := dls.Get(ctx, a.DeadLetter, a.Position)
	if err != nil {
		return ActionView{}, err
	}
	v := ActionView{Action: a.Kind, Consumer: a.Consumer, MessageID: dl.MessageID, DeadLetter: a.DeadLetter, Position: a.Position}
	refuse := func(format string, args ...any) (ActionView, error) {
		return ActionView{}, fmt.Errorf("%w: %w: dead letter %s of %s: %s; nothing published", ErrNotReplayable, idemdriver.ErrWrongState,
			a.Position, a.DeadLetter, fmt.Sprintf(format, args...))
	}
	forceable := func(format string, args ...any) (ActionView, error) {
		v, err := refuse(format, args...)
		return v, fmt.Errorf("%w (%w)", err, ErrForceable)
	}
	if dl.MessageID == "" || dl.Reason == idem.ReasonMissingMessageID || dl.Reason == idem.ReasonInvalidMessageID {
		return refuse("it has no usable message ID (reason %q): its copy would be dead-lettered again", dl.Reason)
	}
	if dl.Source == "" {
		return refuse("it does not name its source")
	}
	rec, err := st.Inspect(ctx, a.Consumer, dl.MessageID)
	found := err == nil
	var (
		reopener    idemdriver.Reopener // set: reopen rec, completed with a dead-letter answer
		deadOutcome string              // that answer's reason
	)
	switch {
	case errors.Is(err, idemdriver.ErrNotFound):
	case err != nil:
		return ActionView{}, err
	case rec.State == idemdriver.StateCompleted:
		reason, dead := idemhttp.DeadLetterAnswer(rec.ContentType, rec.Result)
		ro, canReopen := st.(idemdriver.Reopener)
		switch {
		case !dead:
			return refuse("message %q of consumer %q is completed, and its record holds no dead-letter answer of idem consume: it was processed (replayed before, or redelivered); "+
				"a copy would be settled as that record says, without running again", dl.MessageID, a.Consumer)
		case !canReopen:
			v, err := refuse("message %q of consumer %q is completed with the dead letter's outcome (%s) as its result, which this store cannot reopen, "+
				"so a copy would be dead-lettered again without a call: to run it again, publish it under a new message ID, or replay it after retention has purged its record",
				dl.MessageID, a.Consumer, reason)
			return v, fmt.Errorf("%w (%w)", err, ErrRecordedOutcome)
		}
		reopener, deadOutcome = ro, reason
	case rec.State == idemdriver.StateInProgress && rec.Attempt > 0 && rec.LeaseExpiresAt.After(now()):
		// Attempt 0: made retryable or reopened, no attempt since; its
		// lease ended at the store's clock, which may run ahead of now.
		return refuse("message %q of consumer %q is being processed (attempt %d holds its lease until %s)", dl.MessageID, a.Consumer, rec.Attempt, rec.LeaseExpiresAt.UTC().Format(time.RFC3339))
	case rec.State == idemdriver.StateInProgress && !a.Force:
		return forceable("message %q of consumer %q is retryable already: it was replayed (or retried) and waits for that delivery; if no copy is on its way (a retry made without a publish, or a replay the broker dropped), replay with force: the consumer drops any copy after the first as a duplicate", dl.MessageID, a.Consumer)
	}
	if err := dls.Replayable(ctx, dl); err != nil {
		return ActionView{}, err
	}
	what := "it had no record: processed as a new message"
	if found {
		what = "its record is retryable: the copy is processed as attempt 1 of a fresh round"
	}
	switch {
	case reopener != nil:
		res, err := reopener.ReopenRecord(ctx, &idemdriver.ReopenRecordParams{Consumer: a.Consumer, MessageID: dl.MessageID, Token: rec.Token})
		if errors.Is(err, idemdriver.ErrWrongState) || errors.Is(err, idemdriver.ErrNotFound) {
			return refuse("message %q of consumer %q changed since it was read (%v); look again", dl.MessageID, a.Consumer, err)
		}
		if err != nil {
			return ActionView{}, err
		}
		switch {
		case !res.Changed && !a.Force:
			return refuse("message %q of consumer %q was reopened by another replay just now", dl.MessageID, a.Consumer)
		case !res.Changed:
			what = "another replay reopened its record just now (it is in progress under a later token): this copy is processed only if that replay's copy is not; otherwise it is dropped as a duplicate"
		default:
			what = fmt.Sprintf("its record, completed with the dead letter's outcome (%s), was reopened: the copy is processed as attempt 1 of a fresh round, and calls the service again", deadOutcome)
		}
	case found && rec.State == idemdriver.StateFailed:
		res, err := st.RetryRecord(ctx, a.Consumer, dl.MessageID)
		if err != nil {
			return ActionView{}, err
		}
		if !res.Changed && !a.Force {
			return refuse("message %q of consumer %q was made retryable by another replay or retry just now", dl.MessageID, a.Consumer)
		}
	}
	at, err := dls.Republish(ctx, dl)
	if err != nil {
		if found {
			return ActionView{}, fmt.Errorf("%w (message %q of consumer %q is retryable now: replay with force when a copy can reach it; %w)", err, dl.MessageID, a.Consumer, ErrForceable)
		}
		return ActionView{}, err
	}
	v.Changed, v.Replayed = true, at
	if rec, err := st.Inspect(ctx, a.Consumer, dl.MessageID); err == nil {
		rv := NewRecordView(rec, now())
		v.Record = &rv
	}
	v.Message = fmt.Sprintf("replayed dead letter %s of %s to %s as message %q (%s); %s", a.Position, a.DeadLetter, dl.Source, dl.MessageID, at, what)
	return v, nil
}

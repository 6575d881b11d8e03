package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdriver"
)

// processInOrder is ProcessBatch with InOrder: parts of at most
// idemdriver.MaxLeaseBatch messages, one after the other, each in order;
// once one part stopped (ctx ended, or EndRetries), the messages of the
// later parts are not claimed and are returned to be redelivered.
func (d *Deliverer) processInOrder(ctx context.Context, msgs []idem.Message) []idem.Outcome {
	outs := make([]idem.Outcome, len(msgs))
	for start := 0; start < len(msgs); {
		end := start + min(len(msgs)-start, idemdriver.MaxLeaseBatch)
		if !d.inOrderPart(ctx, msgs[start:end], outs[start:end]) {
			for i := end; i < len(msgs); i++ {
				outs[i] = d.settle(notSentOutcome(msgs[i], d.stopCause(ctx)), nil)
			}
			break
		}
		start = end
	}
	return outs
}

// inOrderPart processes msgs (at most idemdriver.MaxLeaseBatch) in order
// into outs: claimed in one store call (unless pointLate: then each by
// Process in turn), called one at a time, a message to be redelivered
// retried in place (retryInPlace) after the answers of the calls before
// it are recorded, and the answers recorded in one store call at the end.
// It reports false when ctx ended (or EndRetries was called) before every
// message was done: the
// message retried and the ones after it are then released without a call
// and returned to be redelivered.
func (d *Deliverer) inOrderPart(ctx context.Context, msgs []idem.Message, outs []idem.Outcome) bool {
	each := d.pointLate()
	atts := make([]*idem.Attempt, len(msgs))
	if !each {
		var claimed []idem.Outcome
		atts, claimed = d.claimBatch(ctx, msgs)
		copy(outs, claimed)
	}
	var done []*idem.Attempt
	var answers []*answer
	var doneIdx []int // doneIdx[k] is the message of done[k]
	// The ending writes are bounded each on its own: retries in place
	// may take longer than batchFinishTimeout in all.
	finish := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), batchFinishTimeout)
	}
	record := func() {
		fctx, cancel := finish()
		defer cancel()
		for k, out := range d.recordAnswers(fctx, done, answers) {
			outs[doneIdx[k]] = out
		}
		done, answers, doneIdx = done[:0], answers[:0], doneIdx[:0]
	}
	for i, m := range msgs {
		switch a := atts[i]; {
		case a != nil:
			ans, err := d.deliverGuarded(a)
			if err == nil {
				done, answers, doneIdx = append(done, a), append(answers, ans), append(doneIdx, i)
				continue
			}
			fctx, cancel := finish()
			out, rerr := a.Release(fctx, err)
			outs[i] = d.settle(abandonHeld(fctx, a, out, rerr), nil)
			cancel()
		case each:
			outs[i], _ = d.Process(ctx, m)
		default:
			outs[i] = d.settle(outs[i], nil)
		}
		if !redelivered(outs[i]) {
			continue
		}
		// Its redelivery may find one of the messages before it (the
		// same ID twice in a batch), and a crash while it waits must
		// not leave their calls unrecorded.
		record()
		// In progress under an earlier claim of this batch, now ended:
		// no need to wait out that lease.
		mine := slices.ContainsFunc(msgs[:i], func(e idem.Message) bool { return e.ID == m.ID })
		if d.retryInPlace(ctx, m, &outs[i], mine) {
			continue
		}
		fctx, cancel := finish()
		defer cancel()
		for j := i + 1; j < len(msgs); j++ {
			// Not settled ahead of it, whatever their claim found.
			if a := atts[j]; a != nil {
				outs[j] = d.releaseUnsent(fctx, a, d.stopCause(ctx))
			} else {
				outs[j] = d.settle(notSentOutcome(msgs[j], d.stopCause(ctx)), nil)
			}
		}
		return false
	}
	record()
	return true
}

// errRetriesEnded is the cause of the messages of an InOrder batch left
// to be redelivered because EndRetries was called.
var errRetriesEnded = errors.New("idemhttp: retries in place ended (the adapter is stopping)")

// EndRetries ends the retries in place of InOrder batches, now and from
// now on: a message waiting for its retry, and the ones after it in its
// batch, are released without a call (the ones held) and returned
// Failed, to be redelivered, as when the batch's context ends; calls
// already running finish. For an adapter's graceful stop, which lets the
// handlers in flight finish: call it when the stop begins. It does
// nothing without InOrder, and nothing more when called again.
func (d *Deliverer) EndRetries() { d.endRetries.Do(func() { close(d.retriesEnded) }) }

// stopCause is why an InOrder batch stops retrying in place: ctx's end,
// or EndRetries.
func (d *Deliverer) stopCause(ctx context.Context) error {
	if err := context.Cause(ctx); err != nil {
		return err
	}
	return errRetriesEnded
}

// redelivered reports whether an adapter would redeliver the message of
// out (idem.Outcome.Settle's Redeliver).
func redelivered(out idem.Outcome) bool { return out.Settle(0).Action == idem.Redeliver }

// retryInPlace processes m again, as Process does, after the wait out
// asks for (its RetryAfter, else the backoff of the tries so far), until
// its outcome is no longer to be redelivered, which it stores in *out.
// With now, the first try does not wait. It reports false, *out still to
// be redelivered, when ctx ends first or EndRetries ends the wait.
func (d *Deliverer) retryInPlace(ctx context.Context, m idem.Message, out *idem.Outcome, now bool) bool {
	for tries := 1; redelivered(*out); tries++ {
		wait := out.RetryAfter
		if wait <= 0 {
			wait = d.backoff(tries)
		}
		if now && tries == 1 {
			wait = 0
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-d.retriesEnded:
			t.Stop()
			return false
		case <-t.C:
		}
		*out, _ = d.Process(ctx, m)
	}
	return true
}

// releaseUnsent releases a, held and never called, because cause (the
// end of the batch's context) came first: at most once its recovery
// point is settled in the release, so the next attempt sends it.
func (d *Deliverer) releaseUnsent(ctx context.Context, a *idem.Attempt, cause error) idem.Outcome {
	err := d.settled(a, fmt.Errorf("idemhttp: the message was not sent, an earlier message of its batch was not done: %w", cause))
	out, rerr := a.Release(ctx, err)
	return d.settle(abandonHeld(ctx, a, out, rerr), nil)
}

// notSentOutcome is the outcome of m, not called because an earlier
// message of its batch was not done when cause stopped the batch:
// Failed, to be redelivered.
func notSentOutcome(m idem.Message, cause error) idem.Outcome {
	return idem.Outcome{Status: idem.Failed, MessageID: m.ID,
		Err: fmt.Errorf("idemhttp: the message was not sent, an earlier message of its batch was not done: %w", cause)}
}
